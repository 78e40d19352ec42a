"""wanxport.control layer (see docs/design.md section 2): the authenticated control channel.

QUIC + TLS 1.3 with certificates on both sides (aioquic), over which two
gateways agree on paths, ciphers, keys and shards. See docs/notes/control.md.
"""

from .admission import AdmissionLimits
from .certs import CertificateError, load_identity, make_test_pki
from .channel import connect_control, connect_control_any, serve_control
from .keys import KeySchedule, RotationLimits
from .link import ControlClosed, ControlConnectError, ControlConnectionLost, SessionRefused
from .messages import (
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    RESUME_BATCH,
    Bye,
    ControlProtocolError,
    Hello,
    Keys,
    KeyUpdate,
    Message,
    PathStatus,
    ResumeHave,
    ResumeQuery,
    ShardAnnounce,
    ShardComplete,
    Welcome,
    answer_hello,
    for_version,
)
from .resilient import ResilientControl
from .server import ControlServer
from .session import ControlChannel

__all__ = [
    "AdmissionLimits",
    "Bye",
    "CertificateError",
    "ControlChannel",
    "ControlClosed",
    "ControlConnectError",
    "ControlConnectionLost",
    "ControlProtocolError",
    "ControlServer",
    "Hello",
    "KeySchedule",
    "KeyUpdate",
    "Keys",
    "MIN_PROTOCOL_VERSION",
    "Message",
    "PROTOCOL_VERSION",
    "PathStatus",
    "RESUME_BATCH",
    "ResilientControl",
    "ResumeHave",
    "ResumeQuery",
    "RotationLimits",
    "SessionRefused",
    "ShardAnnounce",
    "ShardComplete",
    "Welcome",
    "answer_hello",
    "for_version",
    "connect_control",
    "connect_control_any",
    "load_identity",
    "make_test_pki",
    "serve_control",
]

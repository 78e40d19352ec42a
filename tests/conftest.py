"""Shared test settings: a seeded, deadline-free hypothesis profile.

Property tests must be reproducible on a small, noisy machine, so examples are
derived from the test itself (``derandomize``) and never timed out per example.
"""

from hypothesis import settings

settings.register_profile("wanxport", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("wanxport")

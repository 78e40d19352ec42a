"""A listener nobody reads the refusals of (the daemon) keeps only the latest ones."""

from __future__ import annotations

import asyncio
from pathlib import Path

from wanxport.control.certs import make_test_pki
from wanxport.gateway.listener import KEEP_REJECTIONS, GatewayListener


def test_unread_rejections_are_bounded_and_the_latest_kept(tmp_path: Path) -> None:
    pki = make_test_pki(tmp_path, ["gw"], days=2)

    async def main() -> list[str]:
        listener = GatewayListener([("127.0.0.1", 0)], pki["gw"], pki["ca"])
        for i in range(10 * KEEP_REJECTIONS):
            listener._rejected(ValueError(f"refused {i}"))
        assert listener.rejections.qsize() == KEEP_REJECTIONS
        return [str(listener.rejections.get_nowait()) for _ in range(KEEP_REJECTIONS)]

    kept = asyncio.run(main())
    assert kept == [f"refused {i}" for i in range(9 * KEEP_REJECTIONS, 10 * KEEP_REJECTIONS)]

"""What routing each routed forward of a step used (model/moe.py), to compare with what it was fed."""

from __future__ import annotations

import torch


class RoutingSpy:
    """Every routed forward's (tap kind, the routing it was fed, the routing its routers used), both [B, S, L, k]
    in the batch's layout: taps made to record what they use, so a replaying forward's routing can be compared with
    what it was fed, token by token."""

    def __init__(self, monkeypatch):
        from rlrig.trainer.model import moe

        self.seen: list[tuple[str, torch.Tensor | None, torch.Tensor]] = []
        init, around = moe.RouterTap.__init__, moe.RouterTap.around
        spy = self

        def recording_init(tap, *args, record=False, replay=False, **kw):
            init(tap, *args, record=True, replay=replay, **kw)
            tap.kind = "old" if record or (replay and args[2] is False) else "update"

        def recording_around(tap, layout):
            fed = None if tap.routing is None else tap.routing.clone()
            inner = around(tap, layout)

            class _Ctx:
                def __enter__(self):
                    return inner.__enter__()

                def __exit__(self, *exc):
                    out = inner.__exit__(*exc)
                    read = layout.keep.to(tap.recorded.device)
                    spy.seen.append((tap.kind, None if fed is None else fed[read], tap.recorded[read]))
                    return out

            return _Ctx()

        monkeypatch.setattr(moe.RouterTap, "__init__", recording_init)
        monkeypatch.setattr(moe.RouterTap, "around", recording_around)

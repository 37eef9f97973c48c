"""Passing tensors one step around a ring with torch.distributed point-to-point operations.

With NCCL the transfers run on NCCL's own stream: issuing them makes that stream wait for the
current stream's work so far (the tensors sent are ready), and ``wait()`` makes the current stream
wait for the transfers, without blocking the host, so the next block's attention overlaps them.
"""

from __future__ import annotations

from typing import List, Sequence

import torch
import torch.distributed as dist

__all__ = ["RingExchange"]


class _Pending:
    def __init__(self, works, sent, received):
        self._works, self._sent, self._received = works, sent, received

    def wait(self) -> List[torch.Tensor]:
        for w in self._works:
            w.wait()
        self._works, self._sent = [], []  # (the sent tensors stay referenced until here)
        return self._received


class _Done:
    def __init__(self, tensors):
        self._tensors = list(tensors)

    def wait(self) -> List[torch.Tensor]:
        return self._tensors


def require_member(group_rank: int, global_rank: int) -> None:
    """torch.distributed gives -1 as the group rank of a process outside the group."""
    if group_rank < 0:
        raise ValueError(f"fa3.distributed: group: this process (global rank {global_rank}) is not a member of "
                         "the group; call the layer on the group's ranks only")


class RingExchange:
    """Sends to the next rank of ``group`` and receives from the previous one."""

    def __init__(self, group=None):
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        require_member(self.rank, dist.get_rank())
        self._next = dist.get_global_rank(self.group, (self.rank + 1) % self.world)
        self._prev = dist.get_global_rank(self.group, (self.rank - 1) % self.world)

    def start(self, tensors: Sequence[torch.Tensor]):
        """Starts sending ``tensors`` to the next rank and receiving their likes from the previous
        one; the returned handle's ``wait()`` gives the received tensors."""
        if self.world == 1:
            return _Done(tensors)
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self._next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self._prev, self.group) for r in received]
        return _Pending(dist.batch_isend_irecv(ops), [op.tensor for op in ops], received)

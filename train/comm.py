"""One process or a torchrun group: everything a run does differently under DDP, chosen once
by :func:`join` (in ``build_run``), so the loop never asks how many processes there are.

The group's methods are collectives: every rank calls them at the same point.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from zoo.device import pick_device
from zoo.train.console import say
from zoo.train.resume import gather_epoch_stats

T = TypeVar("T")


class Single:
    """The whole run in this process."""

    rank, world, is_main = 0, 1, True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def wrap(self, model: nn.Module, *, find_unused: bool) -> nn.Module:
        """The module the training forward goes through."""
        return model

    def all_finite(self, loss: float) -> bool:
        """Whether the step's loss is finite (on every rank: they all take the same decision)."""
        return math.isfinite(loss)

    def sum(self, values: list[float]) -> list[float]:
        """``values`` summed over the ranks (float64)."""
        return values

    def gather_stats(self, stats: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's running sums of the epoch so far, for the checkpoint."""
        return [dict(stats)]

    def share(self, make: Callable[[], T]) -> T:
        """``make()`` on rank 0, its result on every rank (e.g. the run folder's path)."""
        return make()

    def barrier(self) -> None:
        """Wait for every rank (e.g. until rank 0 has written a file the others read)."""

    def broadcast_buffers(self, module: nn.Module) -> None:
        """Rank 0's buffers (BatchNorm statistics: the saved ones) on every rank."""


class Group(Single):
    """One rank of a torchrun group (``RANK``/``WORLD_SIZE`` set, ``WORLD_SIZE`` > 1)."""

    def __init__(self, device: torch.device, rank: int, world: int) -> None:
        super().__init__(device)
        self.rank, self.world, self.is_main = rank, world, rank == 0

    def wrap(self, model: nn.Module, *, find_unused: bool) -> nn.Module:
        return nn.parallel.DistributedDataParallel(
            model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            find_unused_parameters=find_unused,
        )

    def all_finite(self, loss: float) -> bool:
        finite = torch.tensor([1.0 if math.isfinite(loss) else 0.0], device=self.device)
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # NCCL needs it on the GPU
        return bool(finite.item() > 0)

    def sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return [float(v) for v in t]

    def gather_stats(self, stats: dict[str, Any]) -> list[dict[str, Any]]:
        return gather_epoch_stats(stats, self.world, self.device)

    def share(self, make: Callable[[], T]) -> T:
        holder: list[Any] = [make() if self.is_main else None]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def barrier(self) -> None:
        dist.barrier()

    def broadcast_buffers(self, module: nn.Module) -> None:
        for b in module.buffers():
            dist.broadcast(b, src=0)


def join(device: str) -> Single:
    """This process's part: a :class:`Group` under torchrun (the process group initialised,
    one GPU per local rank), else :class:`Single` on ``device`` (``auto``: CUDA if any)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Single(pick_device(device))
    if not dist.is_initialized():
        cuda = torch.cuda.is_available() and device != "cpu"
        dist.init_process_group("nccl" if cuda else "gloo")
    dev = pick_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    group = Group(dev, int(os.environ.get("RANK", "0")), world)
    say(
        f"distributed: {world} processes ({dist.get_backend()}); the LR is not rescaled "
        f"automatically: with the per-process batch fixed, the linear scaling rule suggests "
        f"--lr × {world}"
    )
    return group

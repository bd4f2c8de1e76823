"""Multi-turn partial rollouts: a prompt's trajectories across the fully async mode's weight syncs (verl's partial
tool agent loop). A sync halts them at a token boundary; each keeps its turns, tool rounds and open turn, with the
log-probs of the weights that drew each token, and goes on under the new weights on whichever engine takes it next.
An interaction's state travels inside the trajectory (a copy of the interaction, as verl's agent data carries it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..rollout.engines.base import Rollout
from ..rollout.partial import Partial
from .loop import Trajectory
from .rollout import AgentRollout, TurnStats


@dataclass
class AgentPartial:
    index: int  # the prompt's place in the data set
    row: dict | None  # its data row, until its trajectories start
    n: int
    trajs: list[Trajectory] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the weight versions that drew its tokens, in order

    @property
    def finished(self) -> bool:
        return bool(self.trajs) and all(t.done for t in self.trajs)

    drawn_with = Partial.drawn_with


def go_on(agent: AgentRollout, items: list[AgentPartial], stopped, logprobs, version: int) -> None:
    """Every unfinished trajectory of `items` (started here if new) a step further under the weights of `version`,
    until each ends or stopped() halts them (AgentRollout.go_on)."""
    fresh = [it for it in items if not it.trajs]
    if fresh:
        n = fresh[0].n
        trajs = agent.start([it.row for it in fresh], n)
        for j, it in enumerate(fresh):
            it.trajs, it.row = trajs[j * n : (j + 1) * n], None  # the row rides no further trip
    agent.go_on([t for it in items for t in it.trajs], stopped, logprobs)
    for it in items:
        it.drawn_with(version)


def packed(agent: AgentRollout, items: list[AgentPartial]) -> tuple[Rollout, TurnStats]:
    """Finished items' trajectories as one Rollout (item j's at rows j*n ..), their interactions finalized."""
    return agent.finish([t for it in items for t in it.trajs])

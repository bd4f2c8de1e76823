"""How a step's batch is generated and trained: one class per mode, chosen once from the config (`mode_of`).

Colocated (actor_rollout_ref.hybrid_engine=True): each training worker generates its share of the batch with its
  own engine and trains on it.
DynamicSampling: colocated, with DAPO's dynamic sampling (algorithm.filter_groups.enable; driver/dynamic_sampling.py).
SyncPool: a rollout pool of its own generates each batch with the weights of the step before (driver/rollout_pool.py).
OneStepOffPolicy: the pool generates the next batch while the trainer trains on this one.
FullyAsync: the pool streams samples into a queue the trainer takes its updates from; a step is a weight version
  (driver/fully_async.py).
"""

from __future__ import annotations

from collections.abc import Callable

from .. import metrics as M
from ..config.overrides import FULLY_ASYNC
from ..errors import ConfigError
from ..model.micro_batches import shares_by_sample
from ..workers.step.request import StepRequest
from . import curriculum, dynamic_sampling
from .fully_async import Stream, total_versions, version_step
from .launch import Workers
from .reporting import say
from .rollout_pool import RolloutPool, Share
from .stages import Prepared, Progress
from .validation import validate_rows


def equal_shares(rows: list, parts: int) -> list[list]:
    """`rows` cut into `parts` consecutive shares of len(rows) // parts each (config validation keeps a batch a
    multiple of the workers, so nothing is left over)."""
    size = len(rows) // parts
    return [rows[i * size : (i + 1) * size] for i in range(parts)]


def update_kl_controller(kl_ctrl, m: dict, cfg) -> None:
    """After a step with KL in the reward: adapt the coefficient by the batch's number of samples
    (prompts x n, as verl passes it), and log it."""
    if "actor/reward_kl_penalty" in m:
        kl_ctrl.update(m["actor/reward_kl_penalty"], cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n)
        m["actor/reward_kl_penalty_coeff"] = kl_ctrl.value


def step_on(worker, share: Share, kl: float, step: int, local: int | None = None, keep: bool = False):
    """A training worker's step on its share of a rollout pool's samples."""
    req = StepRequest(
        share.rows, step, kl, share.samples, share.turns, first_sample=share.first_sample, keep=keep, local_step=local
    )
    return worker.step.remote(req)


class Mode:
    """A way of generating and training the run's steps, over started workers. The driver calls, in this order:
    `plan` while preparing (before any worker exists), `start` once the workers are up, `resume(step, trainer)`
    after a checkpoint's load, then `step(progress)` for each step (its metrics; None: the prompts ran out before
    it), `validate(step)` and `checkpoint_extras()` when due, `exhausted()` between steps, and `close()` at the end.
    A mode keeps its own state (a pool, a stream); the driver never asks which mode it runs."""

    def __init__(self, prep: Prepared, workers: Workers):
        self.prep, self.workers = prep, workers

    @classmethod
    def plan(cls, cfg, sampler, prompts: int) -> tuple[int, int]:
        """(updates, steps) of the run: a step is an update, trainer.total_training_steps of them or the epochs'."""
        t = cfg.trainer
        total = t.total_training_steps or sampler.steps_per_epoch() * t.total_epochs
        return total, total

    @classmethod
    def start(cls, prep: Prepared, workers: Workers, engines: list[str]) -> Mode:
        """The mode over the started workers (`engines`: the rollout engines they run, by name)."""
        return cls(prep, workers)

    @property
    def test_freq(self) -> int:
        """Validate every this many steps (and after the last); 0: never."""
        return self.prep.cfg.trainer.test_freq

    def step(self, progress: Progress) -> dict | None:
        """Step progress.step generated and trained: its metrics, or None where the prompts ran out before it. A
        mode that draws the next batch ahead records where the data stood before it in progress.ahead_from."""
        raise NotImplementedError

    def resume(self, step: int, trainer: dict) -> None:
        """Resumed at `step` from a checkpoint whose trainer.json is `trainer`."""

    def validate(self, step: int) -> dict:
        """The validation metrics with the weights of `step`."""
        p = self.prep
        return validate_rows(self.workers.training, p.val_rows, p.cfg, step, p.out)

    def checkpoint_extras(self) -> dict:
        """The mode's own part of a checkpoint's trainer.json."""
        return {}

    def exhausted(self) -> bool:
        """No further step can be made before the planned last one."""
        return False

    def close(self) -> None:
        """At shut-down, before the workers are."""

    def trained(self, results: list[dict], batch: list[dict], step: int, pooled: dict) -> dict:
        """A step's metrics from its workers' results and the rollout's (`pooled`); a curriculum sampler handed the
        step's samples and the KL controller updated."""
        p = self.prep
        m = M.reduce(results)
        if p.sampler.curriculum:
            curriculum.hand_over(p.sampler, self.workers.training, batch, step, p.pad_id)
        m.update(pooled)
        update_kl_controller(p.kl_ctrl, m, p.cfg)
        return m


def prompt_shares(rows: list, workers: int, n: int) -> list[dict]:
    """Each worker's part of a colocated step: its equal share of the prompts, n samples of each."""
    return [{"rows": share} for share in equal_shares(rows, workers)]


def sample_shares(rows: list, workers: int, n: int) -> list[dict]:
    """Each worker's part of a colocated step shared by sample (micro_batches.shares_by_sample): an equal share of
    the prompts x n samples, a row per sample, numbered in the step."""
    shares = equal_shares([row for row in rows for _ in range(n)], workers)
    return [{"rows": s, "per_row": 1, "first_sample": i * len(s)} for i, s in enumerate(shares)]


class Colocated(Mode):
    """Each training worker generates an equal share of the step's batch with its own engine, then all update."""

    def __init__(self, prep: Prepared, workers: Workers):
        super().__init__(prep, workers)
        self.shares = sample_shares if shares_by_sample(prep.cfg) else prompt_shares

    def step(self, progress: Progress) -> dict:
        import ray

        p, workers, step = self.prep, self.workers.training, progress.step
        batch = [p.train_rows[i] for i in p.sampler.next()]
        shares = self.shares(batch, len(workers), p.cfg.actor_rollout_ref.rollout.n)
        p.faults.arm_training(step, workers)
        kl, keep = p.kl_ctrl.value, p.sampler.curriculum
        steps = [
            w.step.remote(StepRequest(global_step=step, kl_coef=kl, keep=keep, **share))
            for w, share in zip(workers, shares)
        ]
        return self.trained(ray.get(steps), batch, step, {})


class DynamicSampling(Colocated):
    """Colocated with DAPO's dynamic sampling (algorithm.filter_groups.enable): generation batches of
    data.gen_batch_size prompts until data.train_batch_size prompts' groups are kept, then the step on exactly those
    (driver/dynamic_sampling.py)."""

    def __init__(self, prep: Prepared, workers: Workers):
        super().__init__(prep, workers)
        self.filler = dynamic_sampling.BatchFiller(
            prep.cfg, prep.pad_id, len(workers.training), self.draw, self.generate
        )
        self.step_now = 0  # the step whose generation batches are being drawn

    @classmethod
    def plan(cls, cfg, sampler, prompts: int) -> tuple[int, int]:
        """The sampler draws generation batches; the steps are counted in them, as verl's data loader counts."""
        sampler.batch = cfg.data.gen_batch_size or cfg.data.train_batch_size
        if sampler.steps_per_epoch() < 1:
            raise ConfigError(f"data.gen_batch_size={sampler.batch} is larger than the {prompts} training prompts")
        return super().plan(cfg, sampler, prompts)

    def draw(self) -> list[dict] | None:
        p = self.prep
        if self.exhausted():
            return None
        return [p.train_rows[i] for i in p.sampler.next()]

    def generate(self, shares: list[list[dict]]) -> list:
        import ray

        kl, step = self.prep.kl_ctrl.value, self.step_now
        workers = self.workers.training
        return ray.get([w.generate.remote(StepRequest(s, step, kl)) for w, s in zip(workers, shares)])

    def step(self, progress: Progress) -> dict | None:
        import ray

        p, workers, step = self.prep, self.workers.training, progress.step
        p.faults.arm_training(step, workers)
        self.step_now = step
        filled = self.filler.fill()
        if filled is None:
            return None
        rows = equal_shares(filled.rows, len(workers))
        kl, keep = p.kl_ctrl.value, p.sampler.curriculum
        at = [sum(len(r) for r in rows[:i]) * p.cfg.actor_rollout_ref.rollout.n for i in range(len(workers))]
        steps = [
            w.step.remote(StepRequest(r, step, kl, first_sample=first, scored=s, keep=keep))
            for w, r, s, first in zip(workers, rows, filled.shares, at)
        ]
        return self.trained(ray.get(steps), filled.rows, step, filled.metrics)

    def exhausted(self) -> bool:
        """trainer.total_epochs passes over the data are drawn (verl's recipe loops over its data loader that often)."""
        s = self.prep.sampler
        next_epoch = s.epoch + (s.pos + s.batch > s.steps_per_epoch() * s.batch)
        return next_epoch >= self.prep.cfg.trainer.total_epochs


def connected_pool(prep: Prepared, workers: Workers) -> RolloutPool:
    """The rollout pool's schedule over its workers, joined to training rank 0 for the weight sync."""
    pool = RolloutPool(workers.rollout, workers.training, prep.cfg.actor_rollout_ref.rollout.n, prep.pad_id)
    pool.connect()
    return pool


class Pooled(Mode):
    """The modes with a rollout pool of their own: validation runs on the pool with the weights just trained."""

    def __init__(self, prep: Prepared, workers: Workers, pool: RolloutPool):
        super().__init__(prep, workers)
        self.pool = pool

    @classmethod
    def start(cls, prep: Prepared, workers: Workers, engines: list[str]) -> Mode:
        pool = connected_pool(prep, workers)
        cls.check_engines(prep.cfg, workers, engines)
        mode = cls(prep, workers, pool)
        say(f"rollout pool: {len(workers.rollout)} engine(s), {prep.cfg.trainer.async_mode}")
        return mode

    @classmethod
    def check_engines(cls, cfg, workers: Workers, engines: list[str]) -> None:
        """Raises ConfigError where the pool's engines cannot serve the mode."""

    def resume(self, step: int, trainer: dict) -> None:
        self.pool.trained = step

    def validate(self, step: int) -> dict:
        """After the batch the pool may be generating, with the weights just trained."""
        p = self.prep
        self.pool.settle()
        m = self.pool.push()
        return {**validate_rows(self.workers.rollout, p.val_rows, p.cfg, step, p.out), **m}

    def close(self) -> None:
        self.pool.stop()


class SyncPool(Pooled):
    """Before step k's batch is generated the engines take the weights of step k-1: every sample is on-policy."""

    def step(self, progress: Progress) -> dict:
        import ray

        p, pool, workers, step = self.prep, self.pool, self.workers.training, progress.step
        if pool.in_flight is not None:
            batch = pool.in_flight.rows  # drawn and generating since the step before (one step off-policy)
        else:
            batch = [p.train_rows[i] for i in p.sampler.next()]
        progress.ahead_from = None
        shares, pooled = pool.rollout(step, batch, len(workers), p.faults, self.ahead(progress))
        p.faults.arm_training(step, workers)
        kl, keep = p.kl_ctrl.value, p.sampler.curriculum
        steps = [step_on(w, s, kl, step, keep=keep) for w, s in zip(workers, shares)]
        m = self.trained(ray.get(steps), batch, step, pooled)
        pool.trained = step
        return m

    def ahead(self, progress: Progress) -> Callable[[], list[dict]] | None:
        """What draws the next step's batch to generate while this one trains; None: nothing is drawn ahead."""
        return None


class OneStepOffPolicy(SyncPool):
    """When step k's batch is in, the engines take the weights of step k-1 and start on batch k+1 while the trainer
    trains on batch k (verl's one_step_off_policy recipe)."""

    def ahead(self, progress: Progress) -> Callable[[], list[dict]] | None:
        p = self.prep
        if progress.step >= p.total:
            return None

        def draw() -> list[dict]:
            progress.ahead_from = (p.sampler.epoch, p.sampler.pos)
            return [p.train_rows[i] for i in p.sampler.next()]

        return draw


class FullyAsync(Pooled):
    """verl's fully async recipe: prompts drawn one at a time stream through the engines into a queue; a step is a
    weight version of up to trigger_parameter_sync_step updates (driver/fully_async.py)."""

    def __init__(self, prep: Prepared, workers: Workers, pool: RolloutPool):
        super().__init__(prep, workers, pool)
        self.stream = Stream(pool, prep.train_rows, prep.cfg, prep.sampler, prep.updates)

    @classmethod
    def plan(cls, cfg, sampler, prompts: int) -> tuple[int, int]:
        """Prompts drawn one at a time; the updates the prompts fill, trigger_parameter_sync_step to a step."""
        sampler.batch = 1
        updates, total = total_versions(cfg, prompts)
        if total < 1:
            raise ConfigError(
                f"rollout.total_rollout_steps={cfg.rollout.total_rollout_steps} prompts do not fill one update of "
                f"{cfg.data.train_batch_size} (async_training.require_batches x ppo_mini_batch_size); raise it"
            )
        t = cfg.trainer
        if t.test_freq > 0:
            say(
                f"trainer.test_freq={t.test_freq} is not read in the fully async mode (nor by verl's); validation "
                f"follows rollout.test_freq={cfg.rollout.test_freq} weight versions"
            )
        return updates, total

    @classmethod
    def check_engines(cls, cfg, workers: Workers, engines: list[str]) -> None:
        import ray

        interruptible = ray.get([w.interruptible.remote() for w in workers.rollout])
        if cfg.async_training.partial_rollout and not all(interruptible):
            raise ConfigError(
                "async_training.partial_rollout=True: rlrig interrupts a generation at a weight sync in its hf "
                f"and vLLM engines, not {', '.join(engines)}; set async_training.partial_rollout=False "
                "(generations in flight then finish under the weights they started with)"
            )

    @property
    def test_freq(self) -> int:
        """Every rollout.test_freq weight versions, as verl's."""
        return self.prep.cfg.rollout.test_freq

    def step(self, progress: Progress) -> dict | None:
        p, workers, step = self.prep, self.workers.training, progress.step

        def start_update(rows: list[dict], ro, turns: list[dict], local: int) -> list:
            if local == 1:
                p.faults.arm_training(step, workers)
                p.faults.arm_rollout(step, self.pool.workers)
            shares = self.pool.shares(ro, turns, rows, len(workers))
            return [step_on(w, s, p.kl_ctrl.value, self.stream.updates, local) for w, s in zip(workers, shares)]

        return version_step(self.stream, step, start_update, lambda m: update_kl_controller(p.kl_ctrl, m, p.cfg))

    def resume(self, step: int, trainer: dict) -> None:
        """The prompts the checkpoint's run drew and did not train are generated first; a checkpoint of another mode
        has none pending, and made one update a step."""
        super().resume(step, trainer)
        self.stream.todo.extend(trainer.get("pending", []))
        self.stream.updates = trainer.get("updates", step)

    def checkpoint_extras(self) -> dict:
        return {"pending": self.stream.pending(), "updates": self.stream.updates}

    def exhausted(self) -> bool:
        return self.stream.exhausted()


def mode_of(cfg) -> type[Mode]:
    """The mode the config asks for (config validation allows only the synchronous one without a rollout pool)."""
    if cfg.actor_rollout_ref.hybrid_engine:
        return DynamicSampling if cfg.algorithm.filter_groups.enable else Colocated
    return {"sync": SyncPool, "one_step_off_policy": OneStepOffPolicy, FULLY_ASYNC: FullyAsync}[cfg.trainer.async_mode]

"""data.sampler.class_path/class_name (verl's): a sampler class of the user's own, loaded from a file, built with
verl's arguments and drawn from in whole batches, epoch after epoch, from where a checkpoint left off; what verl's
interface does not allow refused in one line; a sampler's own state saved and restored with a checkpoint."""

import textwrap

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.data.custom_sampler import CustomSampler, make_sampler
from rlrig.trainer.data.sampler import Sampler
from rlrig.trainer.errors import ConfigError

ROWS = [{"prompt": str(i)} for i in range(7)]

SAMPLERS = textwrap.dedent(
    """
    import torch.utils.data


    class Backwards(torch.utils.data.Sampler):
        # every epoch starts its iterator anew: the epoch number is how many times it was started
        def __init__(self, data_source, data_config):
            self.n, self.started = len(data_source), 0
            self.batch, self.seed = data_config.train_batch_size, data_config.get("seed")

        def __iter__(self):
            self.started += 1
            return iter(range(self.n - 1, -1, -1))

        def __len__(self):
            return self.n


    class Curriculum(Backwards):
        def update(self, batch):
            self.seen = len(batch)

        def state_dict(self):
            return {"seen": self.seen}

        def load_state_dict(self, state):
            self.seen = state["seen"]


    class OneArgument(Backwards):
        def __init__(self, data_source):
            pass


    class OutOfRange(Backwards):
        def __iter__(self):
            return iter([0, 1, 99])


    class Short(Backwards):
        def __iter__(self):
            return iter([0])


    class NoLength:
        def __init__(self, data_source, data_config):
            pass

        def __iter__(self):
            return iter([0, 1, 2])
    """
)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "samplers.py"
    path.write_text(SAMPLERS)

    def cfg(name: str | None, batch: int = 3):
        own = [f"data.sampler.class_path={path}", f"data.sampler.class_name={name}"] if name else []
        mini = f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}"
        return parse_overrides([*own, f"data.train_batch_size={batch}", mini, "data.seed=5"]).data

    return cfg


def test_without_a_class_path_the_order_is_rlrigs(data):
    assert type(make_sampler(data(None), ROWS, 3)) is Sampler


def test_the_users_sampler_is_built_as_verl_builds_it_and_drawn_in_whole_batches(data):
    s = make_sampler(data("Backwards"), ROWS, 3)
    assert isinstance(s, CustomSampler) and (s.user.batch, s.user.seed) == (3, 5)  # verl's data config, read
    assert s.steps_per_epoch() == 2  # 7 rows: the seventh is dropped, as verl's drop_last
    drawn = [(s.next(), s.epoch) for _ in range(4)]
    assert drawn == [([6, 5, 4], 0), ([3, 2, 1], 0), ([6, 5, 4], 1), ([3, 2, 1], 1)]
    assert s.user.started == 2  # one iterator an epoch, drawn from lazily


@pytest.mark.parametrize("epoch, pos, then", [(0, 3, ([3, 2, 1], 0)), (1, 6, ([6, 5, 4], 2)), (2, 0, ([6, 5, 4], 2))])
def test_a_restored_position_goes_on_from_there(data, epoch, pos, then):
    s = make_sampler(data("Backwards"), ROWS, 3)
    s.epoch, s.pos = epoch, pos  # as the driver restores a checkpoint's
    assert (s.next(), s.epoch) == then


@pytest.mark.parametrize(
    "name, words",
    [
        ("OneArgument", "OneArgument(data_source=..., data_config=...) failed"),
        ("NoLength", "must be a torch.utils.data.Sampler"),
        ("Missing", "has no Missing"),
    ],
)
def test_what_cannot_be_taken_is_refused_at_start_up(data, name, words):
    with pytest.raises(ConfigError, match="^data.sampler.class_path/class_name: ") as e:
        make_sampler(data(name), ROWS, 3)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "name, words", [("OutOfRange", "yielded 99, not an index of the 7"), ("Short", "yielded 1 indices in an epoch")]
)
def test_what_a_sampler_yields_wrong_is_named_when_drawn(data, name, words):
    with pytest.raises(ConfigError, match=words):
        make_sampler(data(name), ROWS, 3).next()


def test_a_class_name_without_its_path_is_refused():
    with pytest.raises(ConfigError, match="data.sampler.class_name=Backwards is set and class_path is not"):
        parse_overrides(["data.sampler.class_name=Backwards"])


@pytest.mark.parametrize("name, curriculum, state", [("Backwards", False, None), ("Curriculum", True, {"seen": 4})])
def test_a_samplers_own_state_goes_with_the_checkpoint(data, tmp_path, name, curriculum, state):
    s = make_sampler(data(name), ROWS, 3)
    assert s.curriculum is curriculum
    if curriculum:
        s.user.update([0] * 4)
    assert s.state() == state
    if state is not None:
        s.save(s.state(), tmp_path)
    again = make_sampler(data(name), ROWS, 3)
    again.restore(tmp_path)  # a checkpoint without the file (a stateless sampler's): nothing to restore
    assert again.state() == state


def test_a_saved_state_for_a_sampler_without_load_state_dict_is_refused(data, tmp_path):
    CustomSampler.save({"seen": 4}, tmp_path)
    with pytest.raises(ConfigError, match="holds a sampler's state and Backwards has no load_state_dict"):
        make_sampler(data("Backwards"), ROWS, 3).restore(tmp_path)

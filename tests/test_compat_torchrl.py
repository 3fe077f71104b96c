"""xpbank.compat.torchrl.ReplayBufferTrainer: on a real TorchRL Trainer, and against TorchRL's hook."""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict

import xpbank
from xpbank.compat.torchrl import ReplayBufferTrainer

torchrl = pytest.importorskip("torchrl", reason="pip install 'xpbank[torchrl]'")
pytest.importorskip("gymnasium", reason="pip install 'xpbank[gym]'")
from torchrl.collectors import Collector  # noqa: E402
from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer  # noqa: E402
from torchrl.envs import GymEnv  # noqa: E402
from torchrl.modules import MLP, QValueActor  # noqa: E402
from torchrl.objectives import DQNLoss  # noqa: E402
from torchrl.trainers import ReplayBufferTrainer as TorchRLReplayBufferTrainer  # noqa: E402
from torchrl.trainers import Trainer  # noqa: E402

FRAMES, PER_BATCH, OPTIM_STEPS = 64, 16, 3


def _trainer(seed: int = 0) -> tuple[Trainer, DQNLoss]:
    """The smallest real Trainer: CartPole, a 16-unit Q-network, DQN loss, Adam."""
    torch.manual_seed(seed)
    env = GymEnv("CartPole-v1")
    env.set_seed(seed)
    actor = QValueActor(
        MLP(in_features=4, out_features=2, num_cells=[16]), in_keys=["observation"], spec=env.action_spec
    )
    loss = DQNLoss(actor, action_space=env.action_spec, delay_value=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(
            collector=Collector(env, actor, frames_per_batch=PER_BATCH, total_frames=FRAMES),
            total_frames=FRAMES,
            frame_skip=1,
            optim_steps_per_batch=OPTIM_STEPS,
            loss_module=loss,
            optimizer=torch.optim.Adam(loss.parameters(), 1e-2),
            progress_bar=False,
            save_trainer_file=None,
            log_interval=10**9,
        )
    return trainer, loss


def _params(loss: DQNLoss) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in loss.parameters()])


def _train(trainer: Trainer) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()


BUFFERS = {
    "xpbank-uniform": lambda: xpbank.ReplayBuffer(1000, seed=0),
    "xpbank-prioritized": lambda: xpbank.ReplayBuffer(
        1000, sampler=xpbank.PrioritizedSampler(alpha=0.7), seed=0
    ),
    "torchrl-uniform": lambda: TensorDictReplayBuffer(storage=LazyTensorStorage(1000), batch_size=8),
}


@pytest.mark.parametrize("kind", list(BUFFERS))
def test_registered_on_a_real_trainer_runs_optimization_steps(kind):
    trainer, loss = _trainer()
    rb = BUFFERS[kind]()
    hook = ReplayBufferTrainer(rb, batch_size=8)
    hook.register(trainer)
    before = _params(loss)
    _train(trainer)
    assert len(rb) == FRAMES  # every collected frame stored
    assert trainer._optim_count == OPTIM_STEPS * FRAMES // PER_BATCH
    assert not torch.equal(before, _params(loss))  # the optimizer really stepped
    assert trainer._modules["replay_buffer"] is hook
    if kind == "xpbank-prioritized":  # the loss's td_error came back as priorities
        pri = rb.sampler.state_dict()["priorities"][:FRAMES]
        assert pri.unique().numel() > 1


def test_document_example_as_written():
    trainer, loss = _trainer()
    replay_buffer, N = xpbank.ReplayBuffer(1000, sampler=xpbank.PrioritizedSampler(), seed=0), 8

    rb_trainer = ReplayBufferTrainer(replay_buffer=replay_buffer, batch_size=N)
    trainer.register_op("batch_process", rb_trainer.extend)
    trainer.register_op("process_optim_batch", rb_trainer.sample)
    trainer.register_op("post_loss", rb_trainer.update_priority)

    before = _params(loss)
    _train(trainer)
    assert len(replay_buffer) == FRAMES and not torch.equal(before, _params(loss))


def test_torchrl_prioritized_buffer_if_its_extension_loads():
    from torchrl.data import TensorDictPrioritizedReplayBuffer

    try:
        rb = TensorDictPrioritizedReplayBuffer(
            alpha=0.7, beta=0.5, storage=LazyTensorStorage(1000), batch_size=8
        )
        rb.extend(TensorDict({"x": torch.zeros(2)}, [2]))
    except RuntimeError as exc:
        assert "not available" in str(exc)
        pytest.skip(
            f"TorchRL's prioritized sampler needs its compiled extension, which does not load here: {exc}"
        )
    trainer, _ = _trainer()
    rb.empty()
    ReplayBufferTrainer(rb, batch_size=8).register(trainer)
    _train(trainer)
    assert len(rb) == FRAMES


# -- extend: masking, flattening, padding, against TorchRL's hook ------------------------
def _collected(n_envs: int = 2, t: int = 5, with_mask: bool = True) -> TensorDict:
    obs = torch.arange(n_envs * t * 3, dtype=torch.float32).reshape(n_envs, t, 3)
    td = TensorDict(
        {"obs": obs, "next": {"obs": obs + 1, "truncated": torch.zeros(n_envs, t, 1, dtype=torch.bool)}},
        batch_size=[n_envs, t],
    )
    if with_mask:
        mask = torch.ones(n_envs, t, dtype=torch.bool)
        mask[1, 3:] = False  # env 1's last two steps are padding
        td["collector", "mask"] = mask
    return td


def _stored_torchrl(hook_cls, batch, **kwargs) -> TensorDict:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
    hook_cls(rb, batch_size=4, **kwargs).extend(batch)
    return rb[: len(rb)].exclude("index")


def test_flatten_with_mask_keeps_the_valid_steps_like_torchrl():
    batch = _collected()
    rb = xpbank.ReplayBuffer(100)
    ReplayBufferTrainer(rb, batch_size=4, flatten_tensordicts=True).extend(batch)
    want = batch[batch["collector", "mask"]]  # brute force
    got = rb.sample_all()
    assert torch.equal(got["obs"], want["obs"]) and len(got) == 8
    theirs = _stored_torchrl(TorchRLReplayBufferTrainer, _collected(), flatten_tensordicts=True)
    ours = _stored_torchrl(ReplayBufferTrainer, _collected(), flatten_tensordicts=True)
    assert (theirs == ours).all()


def test_flatten_without_mask_marks_cuts_truncated_on_a_copy():
    batch = _collected(with_mask=False)
    rb = xpbank.ReplayBuffer(100)
    stored = ReplayBufferTrainer(rb, batch_size=4, flatten_tensordicts=True).extend(batch)
    want = torch.zeros(2, 5, dtype=torch.bool)
    want[:, -1] = True  # each env's last collected step: the trajectory is cut there
    assert torch.equal(stored["next", "truncated"].reshape(2, 5), want)
    assert torch.equal(rb.sample_all()["next", "truncated"].reshape(2, 5), want)
    assert not batch["next", "truncated"].any()  # the collector's batch is left alone


def test_max_dims_pads_with_minus_one_free_and_never_crops():
    batch = _collected(with_mask=False)
    ours = _stored_torchrl(ReplayBufferTrainer, batch, max_dims=[-1, 7])
    theirs = _stored_torchrl(TorchRLReplayBufferTrainer, batch, max_dims=[-1, 7])
    assert ours.batch_size == theirs.batch_size == torch.Size([2, 7]) and (ours == theirs).all()
    assert torch.equal(ours["obs"][:, :5], batch["obs"]) and not ours["obs"][:, 5:].any()
    rb = xpbank.ReplayBuffer(100)
    hook = ReplayBufferTrainer(rb, batch_size=4, max_dims=[-1, 4])
    with pytest.raises(xpbank.SpecError, match=r"batch dim 1 has size 5, more than max_dims\[1\] = 4"):
        hook.extend(batch)
    with pytest.raises(xpbank.SpecError, match=r"max_dims: expected 2 entries"):
        ReplayBufferTrainer(rb, batch_size=4, max_dims=[3]).extend(batch)
    assert len(rb) == 0


# -- sample, update_priority, state --------------------------------------------------------
def test_update_priority_reaches_the_xpbank_sampler():
    rb = xpbank.ReplayBuffer(100, sampler=xpbank.PrioritizedSampler(alpha=1.0), seed=0)
    hook = ReplayBufferTrainer(rb, batch_size=64, device="cpu")
    rb.extend({"x": torch.arange(10.0)})
    batch = TensorDict({"index": torch.arange(10), "td_error": torch.full((10, 1), 1e-6)}, [10])
    batch["td_error"][3] = 1.0
    hook.update_priority(batch)
    counts = torch.bincount(hook.sample(None)["x"].long(), minlength=10)
    # p(item 3) = 1 / (1 + 9e-6): all 64 draws are item 3 unless a 1-in-1800 event happens
    assert counts[3] >= 63
    with pytest.raises(xpbank.SpecError, match=r"no 'priority' entry \(the loss's priority key\)"):
        ReplayBufferTrainer(rb, batch_size=4, priority_key="priority").update_priority(batch)


def test_uniform_buffer_ignores_priorities_and_batch_size_is_required():
    rb = xpbank.ReplayBuffer(10)
    rb.extend({"x": torch.arange(4.0)})
    ReplayBufferTrainer(rb, batch_size=2).update_priority(TensorDict({"index": torch.arange(2)}, [2]))
    with pytest.raises(xpbank.CapacityError, match="batch_size: an xpbank ReplayBuffer has no default"):
        ReplayBufferTrainer(rb)


def test_iterate_visits_every_item_once_per_pass():
    rb = xpbank.ReplayBuffer(10)
    rb.extend({"x": torch.arange(7.0)})
    hook = ReplayBufferTrainer(rb, batch_size=3, iterate=True)
    seen = []
    with pytest.raises(StopIteration):
        while True:
            seen += hook.sample(None)["x"].tolist()
    assert sorted(seen) == list(range(7))
    assert len(hook.sample(None)) == 3  # a new pass begins


def test_state_dict_round_trip_resumes_sampling():
    rb = xpbank.ReplayBuffer(50, sampler=xpbank.PrioritizedSampler(), seed=1)
    rb.extend({"x": torch.arange(20.0)})
    hook = ReplayBufferTrainer(rb, batch_size=5)
    state = hook.state_dict()
    other = ReplayBufferTrainer(xpbank.ReplayBuffer(50, sampler=xpbank.PrioritizedSampler()), batch_size=5)
    other.load_state_dict(state)
    assert torch.equal(other.sample(None)["x"], hook.sample(None)["x"])


def test_torchrls_flatten_marks_every_step_truncated_in_place_ours_does_not():
    theirs_input, ours_input = _collected(with_mask=False), _collected(with_mask=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
    TorchRLReplayBufferTrainer(rb, flatten_tensordicts=True).extend(theirs_input)
    assert theirs_input["next", "truncated"].all()  # TorchRL: [..., -1] hits the trailing 1-dim
    stored = ReplayBufferTrainer(xpbank.ReplayBuffer(100), batch_size=4, flatten_tensordicts=True).extend(
        ours_input
    )
    assert stored["next", "truncated"].sum() == 2 and not ours_input["next", "truncated"].any()


def test_update_priority_skips_items_overwritten_since_the_sample():
    rb = xpbank.ReplayBuffer(4, sampler=xpbank.PrioritizedSampler(alpha=1.0), seed=0)
    hook = ReplayBufferTrainer(rb, batch_size=4)
    rb.extend({"x": torch.arange(4.0)})
    batch = TensorDict({"index": torch.arange(4), "td_error": torch.tensor([5.0, 5.0, 5.0, 7.0])}, [4])
    rb.extend({"x": torch.tensor([10.0, 11.0])})  # ids 0 and 1 overwritten by 4 and 5
    hook.update_priority(batch)
    pri = rb.sampler.state_dict()["priorities"]
    # slots 0, 1 keep the new items' initial priority (the largest seen before: 1.0);
    # slots 2, 3 got 5 and 7 from the loss (plus the sampler's eps, 1e-6)
    assert pri[:4].tolist() == pytest.approx([1.0, 1.0, 5.0, 7.0], abs=1e-5)


# -- items with batch dims of their own (flatten_tensordicts=False, TorchRL's default) ------
def _trajectories(seed: int = 0) -> tuple[TensorDict, QValueActor]:
    """A real [2, 10] collection: a SerialEnv of two CartPoles, a random-weight Q actor."""
    from torchrl.envs import SerialEnv

    torch.manual_seed(seed)
    env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
    env.set_seed(seed)
    actor = QValueActor(
        MLP(in_features=4, out_features=2, num_cells=[16]), in_keys=["observation"], spec=env.action_spec
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = next(iter(Collector(env, actor, frames_per_batch=20, total_frames=20)))
    return data, actor


def _td_lambda_loss(actor: QValueActor, batch: TensorDict) -> torch.Tensor:
    from torchrl.objectives import ValueEstimators

    loss = DQNLoss(actor, action_space="one-hot", delay_value=False)
    loss.make_value_estimator(ValueEstimators.TDLambda, gamma=0.9, lmbda=0.8)
    return loss(batch.clone())["loss"].detach()


def test_trajectory_items_keep_their_batch_dims_and_give_torchrls_td_lambda_loss():
    data, actor = _trajectories()
    assert data.batch_size == torch.Size([2, 10])
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=RandomSampler(), batch_size=4)
    TorchRLReplayBufferTrainer(theirs, batch_size=4).extend(data.clone())
    rb = xpbank.ReplayBuffer(100, seed=0)
    hook = ReplayBufferTrainer(rb, batch_size=4)
    hook.extend(data.clone())
    assert len(rb) == len(theirs) == 2  # two trajectories, as TorchRL stores them
    ours = hook.sample(None)
    assert ours.batch_size == theirs.sample().batch_size == torch.Size([4, 10])
    items = ours["index"][:, 0]
    assert torch.equal(ours["index"], items[:, None].expand(4, 10))  # expanded like TorchRL's
    same = theirs[items]  # TorchRL's copy of the very items xpbank drew
    assert same.batch_size == ours.batch_size
    assert torch.equal(ours["observation"], same["observation"])
    assert torch.equal(ours["next", "reward"], same["next", "reward"])
    got, want = _td_lambda_loss(actor, ours.exclude("index")), _td_lambda_loss(actor, same.exclude("index"))
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    # the [B] batch xpbank gave before (fields still [B, T, ...]) is another loss: the bug
    old = TensorDict(ours.exclude("index").to_dict(), batch_size=[4])
    assert not torch.allclose(_td_lambda_loss(actor, old), want, rtol=1e-3)


def test_trajectory_items_with_priorities_and_state():
    data, _ = _trajectories()
    rb = xpbank.ReplayBuffer(100, sampler=xpbank.PrioritizedSampler(alpha=1.0), seed=0)
    hook = ReplayBufferTrainer(rb, batch_size=6)
    hook.extend(data)
    batch = hook.sample(None)
    assert batch.batch_size == torch.Size([6, 10]) and batch["weight"].shape == (6, 10)
    td_error = torch.full((6, 10), 1e-3)
    td_error[batch["index"][:, 0] == 1, 7] = 5.0  # one step of item 1: the item's priority is the max
    batch["td_error"] = td_error
    hook.update_priority(batch)
    pri = rb.sampler.state_dict()["priorities"][:2]
    assert (batch["index"][:, 0] == 1).any()  # seed 0 draws item 1
    assert pri[1].item() == pytest.approx(5.0, abs=1e-5)
    other = ReplayBufferTrainer(xpbank.ReplayBuffer(100, sampler=xpbank.PrioritizedSampler()), batch_size=6)
    other.load_state_dict(hook.state_dict())
    assert other.item_dims == [10] and other.sample(None).batch_size == torch.Size([6, 10])
    with pytest.raises(xpbank.SpecError, match=r"holds items of batch dims \[10\], got a collection"):
        hook.extend(data[:, :5])
    assert len(rb) == 2


def test_replay_buffer_refuses_items_with_batch_dims_and_says_what_to_do():
    rb = xpbank.ReplayBuffer(100)
    td = TensorDict({"obs": torch.zeros(2, 5, 4)}, [2, 5])
    with pytest.raises(xpbank.SpecError, match=r"batch dims \[5\] of their own.*batch.reshape\(-1\)"):
        rb.extend(td)
    with pytest.raises(xpbank.SpecError, match=r"add: a TensorDict of batch_size \[5\]"):
        rb.add(td[0])
    assert len(rb) == 0 and rb.spec is None
    assert rb.extend(td.reshape(-1)) == range(10)  # steps as items
    whole = xpbank.ReplayBuffer(10)
    whole.extend(td.to_dict())  # trajectories as fields: [B] batches of [B, 5, 4]
    assert whole.sample(3)["obs"].shape == (3, 5, 4)


# -- the priority stage: OptimizationStepper's post_optim where TorchRL has it ---------------
def test_register_uses_post_optim_without_warnings_and_priorities_come_back():
    from xpbank.compat import torchrl as compat

    trainer, _ = _trainer()
    rb = xpbank.ReplayBuffer(1000, sampler=xpbank.PrioritizedSampler(alpha=0.7), seed=0)
    hook = ReplayBufferTrainer(rb, batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # TorchRL's FutureWarning for 'post_loss' would raise
        hook.register(trainer)
    assert compat._has_optimization_stepper()  # torchrl 0.14 has it: the new path is taken
    assert len(trainer._post_optim_ops) == 1 and not trainer._post_loss_ops
    _train(trainer)
    assert rb.sampler.state_dict()["priorities"][:FRAMES].unique().numel() > 1


def test_priorities_come_back_with_an_optimization_stepper():
    from torchrl.trainers import DefaultOptimizationStepper

    trainer, _ = _trainer()
    trainer.optimization_stepper = DefaultOptimizationStepper()  # post_loss never runs then
    rb = xpbank.ReplayBuffer(1000, sampler=xpbank.PrioritizedSampler(alpha=0.7), seed=0)
    ReplayBufferTrainer(rb, batch_size=8).register(trainer)
    _train(trainer)
    assert rb.sampler.state_dict()["priorities"][:FRAMES].unique().numel() > 1


def test_register_falls_back_to_post_loss_on_an_older_torchrl(monkeypatch):
    from xpbank.compat import torchrl as compat

    monkeypatch.setattr(compat, "_has_optimization_stepper", lambda: False)
    trainer, _ = _trainer()
    rb = xpbank.ReplayBuffer(1000, sampler=xpbank.PrioritizedSampler(alpha=0.7), seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # this TorchRL warns about post_loss; an older one does not
        ReplayBufferTrainer(rb, batch_size=8).register(trainer)
    assert len(trainer._post_loss_ops) == 1 and not trainer._post_optim_ops
    _train(trainer)
    assert rb.sampler.state_dict()["priorities"][:FRAMES].unique().numel() > 1

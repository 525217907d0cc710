"""The adaptive batch schedule's pieces: the phases that map steps to data exactly, and the rule
that doubles the batch on a (synthetic) noise scale."""

from __future__ import annotations

import itertools

import pytest
import torch

from app.config.phases import BatchPhases, Phase
from app.engine.batch_schedule import BatchRamp, RampRule
from app.engine.records.noise_scale import NoiseScale

pytestmark = pytest.mark.unit

# -- the phases -------------------------------------------------------------------------------


def test_one_phase_is_a_fixed_batch():
    phases = BatchPhases.fixed(32)
    assert [phases.samples_seen(d) for d in (0, 1, 10)] == [0, 32, 320]
    assert phases.steps_to(9600) == 300
    assert phases.steps_to(9601) == 301
    assert phases.batch_at(299) == 32


def test_data_seen_stays_exact_across_changes():
    phases = BatchPhases.fixed(8).with_batch_from(10, 16).with_batch_from(15, 32)
    assert phases.phases == (Phase(0, 0, 8), Phase(10, 80, 16), Phase(15, 160, 32))
    # step by step: every step adds the batch of the phase it trains in, nothing more or less
    seen = [phases.samples_seen(d) for d in range(21)]
    added = [b - a for a, b in itertools.pairwise(seen)]
    assert added == [phases.batch_at(s) for s in range(20)]
    assert added == [8] * 10 + [16] * 5 + [32] * 5
    assert seen[-1] == 8 * 10 + 16 * 5 + 32 * 5
    # and back: the fewest steps to a count of samples, in any phase
    assert [phases.steps_to(n) for n in (0, 1, 80, 81, 96, 160, 161, 9600)] == [
        0, 1, 10, 11, 11, 15, 16, 15 + (9600 - 160 + 31) // 32,
    ]  # fmt: skip


def test_a_change_at_a_phase_start_replaces_that_phase():
    phases = BatchPhases.fixed(8).with_batch_from(10, 16).with_batch_from(10, 32)
    assert phases.phases == (Phase(0, 0, 8), Phase(10, 80, 32))
    assert BatchPhases.fixed(8).with_batch_from(0, 16) == BatchPhases.fixed(16)
    with pytest.raises(ValueError, match="before the last phase"):
        phases.with_batch_from(9, 64)


def test_phases_round_trip_through_json_and_refuse_a_gap():
    phases = BatchPhases.fixed(8).with_batch_from(10, 16)
    assert BatchPhases.from_json(phases.to_json()) == phases
    with pytest.raises(ValueError, match="does not follow"):
        BatchPhases((Phase(0, 0, 8), Phase(10, 81, 16)))
    with pytest.raises(ValueError, match="start at step 0"):
        BatchPhases((Phase(1, 0, 8),))


# -- the rule ---------------------------------------------------------------------------------


def _doublings(rule: RampRule, start: int, readings: list[tuple[int, float | None]]):
    """(samples, new batch) at each doubling over readings of (samples seen, noise scale)."""
    ramp, batch, out = BatchRamp(rule), start, []
    for samples, noise in readings:
        if (new := ramp.observe(noise, samples, batch)) is not None:
            batch = new
            out.append((samples, new))
    return out


def test_the_rule_doubles_once_the_noise_scale_has_stayed_above_the_bar_for_the_patience():
    rule = RampRule(fraction=2.0, patience=100, max_batch=64, smoothing=0.95)
    # readings every 50 samples; the noise scale at 16 (= 2 x 8) from sample 200 on
    readings = [(s, 10.0 if s < 200 else 16.0) for s in range(0, 1001, 50)]
    # above the bar at 200, 250, 300: 100 samples on end at 300 -> 16; the bar is then 32
    assert _doublings(rule, 8, readings) == [(300, 16)]


def test_a_reading_below_the_bar_or_unknown_starts_the_wait_again():
    rule = RampRule(fraction=2.0, patience=100, max_batch=64, smoothing=0.95)
    noise = {0: 20, 50: 20, 100: 15, 150: 20, 200: None, 250: 20, 300: 20, 350: 20}
    assert _doublings(rule, 8, list(noise.items())) == [(350, 16)]


def test_the_rule_stops_at_the_max_batch():
    rule = RampRule(fraction=2.0, patience=0, max_batch=32, smoothing=0.95)
    readings = [(s, 1e6) for s in range(0, 500, 10)]
    assert _doublings(rule, 8, readings) == [(0, 16), (10, 32)]


def test_a_restored_rule_decides_as_the_uninterrupted_one():
    rule = RampRule(fraction=2.0, patience=100, max_batch=64, smoothing=0.95)
    readings = [(s, 16.0) for s in range(0, 301, 50)]
    whole = _doublings(rule, 8, readings)
    first = BatchRamp(rule)
    for samples, noise in readings[:2]:  # the wait is under way: above since 0
        assert first.observe(noise, samples, 8) is None
    second = BatchRamp(rule)
    second.load_state_dict(first.state_dict())
    assert [(100, second.observe(16.0, 100, 8))] == whole == [(100, 16)]


def _noise_scale_run(truth_at, steps: int, small: int, batch_at, d: int = 64, seed: int = 0):
    """NoiseScale fed per-sample gradients G + N(0, sigma^2 I) (|G| = 1, so B_simple =
    d sigma^2 = truth_at(samples seen)); yields (samples seen, the smoothed estimate, batch)."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.zeros(d, dtype=torch.float64)
    mean[0] = 1.0
    samples, batch = 0, batch_at(None)
    ns = NoiseScale(batch, torch.device("cpu"), beta=0.95)
    for _ in range(steps):
        sigma = (truth_at(samples) / d) ** 0.5
        per_sample = mean + sigma * torch.randn(batch, d, generator=g, dtype=torch.float64)
        ns.small(per_sample[:small].mean(0).pow(2).sum(), small)
        ns.step(per_sample.mean(0).norm())
        samples += batch
        batch = yield samples, ns.value(), batch
        ns.big = batch


def test_the_rule_follows_a_growing_noise_scale_measured_by_the_estimator():
    """A true noise scale that grows with the data (4 -> ~132 over 40,000 samples): the rule,
    reading the estimator every step, doubles 8 -> 16 -> 32 -> 64 (the max), each time after
    the truth has passed 2x the batch and not long before the next bar (the estimate lags)."""
    truth = lambda samples: 4.0 + samples / 312.5  # noqa: E731
    rule = RampRule(fraction=2.0, patience=400, max_batch=64, smoothing=0.95)
    ramp, batch, changes = BatchRamp(rule), 8, []
    run = _noise_scale_run(truth, steps=2000, small=2, batch_at=lambda _: 8)
    samples, noise, _ = next(run)
    try:
        while True:
            if (new := ramp.observe(noise, samples, batch)) is not None:
                changes.append((samples, truth(samples), new))
                batch = new
            samples, noise, _ = run.send(batch)
    except StopIteration:
        pass
    assert [new for _, _, new in changes] == [16, 32, 64]
    for _, true_noise, new in changes:
        assert true_noise >= 0.9 * new  # the truth had about reached 2 x the old batch
        assert true_noise < 2.0 * new  # and not yet the next bar: the rule does not lag a step


# -- the plan at a grown batch ------------------------------------------------------------------


def test_the_micro_batch_grows_with_the_batch_up_to_the_probes_ceiling():
    from app.engine.batch_plan import BatchPlan

    plan = BatchPlan(8, 4, source="probed", micro_ceiling=12)  # noise scale: two a step
    sizes = []
    for batch in (16, 32, 64):
        plan = plan.at_batch(batch, two_per_step=True)
        sizes.append((plan.effective_batch_size, plan.micro_batch_size, plan.micro_sizes))
    assert sizes == [
        (16, 8, [8, 8]),  # half the share
        (32, 11, [11, 11, 10]),  # the ceiling, as the split gives it: the sizes sum exactly
        (64, 11, [11] * 4 + [10] * 2),
    ]
    assert plan.source == "probed"
    # Without the noise scale the whole share may be one micro-batch
    assert BatchPlan(8, 8, micro_ceiling=16).at_batch(16, two_per_step=False).micro_sizes == [16]


def test_without_a_ceiling_only_the_accumulation_grows():
    from app.engine.batch_plan import BatchPlan

    fixed = BatchPlan(8, 4, world_size=2, rank=1).at_batch(32, two_per_step=True)
    assert (fixed.micro_batch_size, fixed.grad_accum_steps, fixed.micro_sizes) == (4, 4, [4] * 4)
    # Two ranks: each rank's share (16) is what the ceiling caps
    shared = BatchPlan(8, 2, world_size=2, micro_ceiling=64).at_batch(32, two_per_step=True)
    assert (shared.micro_batch_size, shared.grad_accum_steps) == (8, 2)
    # A ceiling at or below the micro-batch (an OOM lowered it) keeps the micro-batch
    capped = BatchPlan(8, 4, micro_ceiling=4).at_batch(64, two_per_step=True)
    assert (capped.micro_batch_size, capped.grad_accum_steps) == (4, 16)

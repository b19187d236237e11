"""Logits that stay on the executor's device (OgaExtStepOutputs.logits_on_device): the engine selects
the rows the device sampler supports through OgaExtDeviceOps.sample, reads back only the logits rows
it selects on the host, and keeps the random streams transactional (the device draws from
(seed, counter); the host publishes the advanced counter only at commit).

The test model's simulated device (device_ops + device_logits) stores the logits encoded, so an
engine that read device memory directly would select other tokens; its `sample` is the host
sampler's own code, so every stream must equal the host-logits engine's stream event for event."""
import random

import pytest

import oga as og
import oga.testing as ogt
from helpers import (E_EXECUTION, FAILED, TOKEN, TURN_FINISHED, Job, OracleSequence, Turn, expected_workload,
                     prompt_without_eos, run_once, run_workload, turn_options)
from test_sampling import apply_options, greedy, long_prompt, run_jobs, sampled

DEVICE = {"device_ops": True, "device_logits": True}


def random_jobs(rng, count):
    jobs = []
    for _ in range(count):
        turns = []
        for _ in range(rng.randrange(1, 4)):
            max_gen = rng.randrange(1, 9)
            turns.append(Turn([rng.randrange(2, 64) for _ in range(rng.randrange(1, 14))], max_gen=max_gen,
                              min_gen=rng.choice([0, 0, min(3, max_gen)])))
        jobs.append(Job(turns, start_run=rng.randrange(0, 30)))
    return jobs


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("device_sampling", [True, False])
def test_greedy_workloads_equal_the_oracle(seed, device_sampling):
    rng = random.Random(seed)
    cfg = dict(max_batch_size=4, max_scheduled_tokens=rng.choice([6, 16, 64]), num_blocks=64,
               device_sampling=device_sampling, **DEVICE)
    jobs = random_jobs(rng, 10)
    result = run_workload(cfg, jobs)
    assert result.per_job == expected_workload(jobs, cfg)
    if device_sampling:
        # Every sampling row went through the device; nothing was read back.
        assert result.counters["device_sampled_rows"] > 0
        assert result.counters["host_read_logits_rows"] == 0
    else:
        assert result.counters["device_sampled_rows"] == 0
        assert result.counters["host_read_logits_rows"] > 0


# One job per policy, batched together, so device rows and host rows share steps.
POLICY_JOBS = [
    [{"prompt": long_prompt(5), "opts": greedy(10)}],
    [{"prompt": long_prompt(7, 1), "opts": sampled(seed=11, max_gen=10)}],
    [{"prompt": long_prompt(6, 2), "opts": sampled(seed=12, temperature=0.7, top_k=5, max_gen=10)}],
    [{"prompt": long_prompt(9, 3), "opts": sampled(seed=13, temperature=1.2, top_p=0.6, max_gen=10)}],
    [{"prompt": long_prompt(4, 4), "opts": greedy(10, repetition_penalty=1.7, min_generated_tokens=6)}],
    [{"prompt": long_prompt(8, 5), "opts": sampled(seed=14, repetition_penalty=0.6, min_generated_tokens=4,
                                                   max_gen=9)}],
    # no-repeat n-grams are not a device processor: this row is read back and selected on the host
    [{"prompt": long_prompt(6, 6), "opts": greedy(10, no_repeat_ngram_size=2)}],
    [{"prompt": long_prompt(5, 7), "opts": sampled(seed=15, max_gen=4)},
     {"prompt": long_prompt(3, 8), "opts": sampled(max_gen=5, temperature=0.9)}],  # second turn: request stream
]


def policy_runs(extra_cfg, fault=None):
    cfg = dict(vocab_size=97, max_batch_size=8, num_blocks=256, context_length=96, **extra_cfg)
    return run_jobs(POLICY_JOBS, model_cfg=cfg, fault=fault)


def test_every_policy_streams_as_on_the_host():
    host, _ = policy_runs({})
    device, _ = policy_runs(DEVICE)
    read_back, _ = policy_runs(dict(DEVICE, device_sampling=False))
    assert device == host
    assert read_back == host


@pytest.mark.parametrize("host_tokens", [6, 2])
def test_only_rows_the_device_cannot_select_are_read_back(host_tokens):
    """A no-repeat n-gram row is read back, a sampled one is not; with the host row's turn shorter
    (2), the device row's later steps read nothing and host_read_logits_rows must not add the
    previous step's count again."""
    cfg = dict(vocab_size=97, max_batch_size=8, num_blocks=256, context_length=96, **DEVICE)
    engine = og.Engine(ogt.create_test_model(**cfg))
    buffer = engine.create_event_buffer(64)
    device_row, host_row = engine.create_request(), engine.create_request()
    device_row.begin_turn(long_prompt(5), apply_options(device_row, sampled(seed=3, max_gen=6)))
    host_row.begin_turn(long_prompt(5, 1), apply_options(host_row, greedy(host_tokens, no_repeat_ngram_size=2)))
    while engine.has_pending_requests():
        engine.run(buffer)
    counters = ogt.engine_counters(engine)
    assert counters["device_sampled_rows"] == 6
    assert counters["host_read_logits_rows"] == host_tokens


def test_retried_steps_do_not_advance_the_device_streams():
    """A step rolled back after the device drew (fault phase "sample" fires after selection) must not
    publish the advanced counters: the retried step draws the same values again."""
    clean, _ = policy_runs(DEVICE)
    faulted, retryable = policy_runs(DEVICE, fault={"phase": "sample", "skip": 3, "count": 4})
    assert retryable == 4
    assert faulted == clean


def test_drafts_are_verified_on_rows_read_back():
    cfg = dict(per_token_logits=True, max_batch_size=4, num_blocks=64, **DEVICE)
    model = ogt.create_test_model(**cfg)
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(64)
    prompt = prompt_without_eos(12)
    expected = OracleSequence().turn(prompt, max_gen=10)[0]
    request = engine.create_request()
    request.begin_turn(prompt, turn_options(request, max_gen=10))
    tokens = []
    proposals = 0
    while engine.has_pending_requests():
        if tokens and proposals < 3 and len(tokens) + 3 < len(expected):
            # Two right drafts, then a wrong one.
            request.set_draft_tokens(expected[len(tokens):len(tokens) + 2] + [(expected[len(tokens) + 2] + 1) % 60 + 2])
            proposals += 1
        tokens += [e.token for e in engine.run(buffer) if e.flags & TOKEN]
    assert tokens == expected
    counters = ogt.engine_counters(engine)
    assert counters["host_read_logits_rows"] >= 4 * proposals  # each verification reads drafts + 1 rows
    assert counters["device_sampled_rows"] > 0  # the steps without a proposal sampled on the device


@pytest.mark.parametrize("phase, device_sampling, text", [
    ("device_sample", True, "simulated device: sampling kernel launch failed"),
    ("device_copy", False, "simulated device: read of 2 rows failed"),
])
def test_a_device_failure_poisons_the_engine_with_its_reason(phase, device_sampling, text):
    model = ogt.create_test_model(max_batch_size=4, num_blocks=64, device_sampling=device_sampling, **DEVICE)
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(64)
    requests = [engine.create_request() for _ in range(2)]
    for r, p in zip(requests, ([5, 6, 7], [8, 9])):
        r.begin_turn(p, turn_options(r, max_gen=8))
    first = [e.token for e in run_once(engine, buffer) if e.flags & TOKEN]
    assert len(first) == 2
    ogt.inject_fault(model, phase)
    events = run_once(engine, buffer)
    assert [e.request for e in events] == requests
    assert all(e.flags & FAILED and e.flags & TURN_FINISHED and e.error_code == E_EXECUTION for e in events)
    with pytest.raises(RuntimeError, match="Token selection failed and the Engine is no longer healthy.*" + text):
        engine.run(buffer)


def test_device_logits_need_device_ops():
    with pytest.raises(RuntimeError, match="device_logits needs test_model.device_ops"):
        ogt.create_test_model(device_logits=True)

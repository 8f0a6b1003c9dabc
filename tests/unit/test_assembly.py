"""A rollout's training record comes from the sampled token ids of its calls, never from text."""

from __future__ import annotations

from rollwire.producers.assembly import assemble
from rollwire.schemas import InferenceCall, WeightVersionSpan


def call(prompt, completion, version=3, logprob=-0.5):
    return InferenceCall(prompt_token_ids=prompt, completion_token_ids=completion,
                         completion_logprobs=[logprob] * len(completion),
                         weight_versions=[WeightVersionSpan(version=version, start=0, end=len(completion))])


def test_a_single_call_is_prompt_plus_sampled_completion():
    record = assemble([call([1, 2, 3], [7, 8])])
    assert (record.prompt_token_ids, record.completion_token_ids, record.loss_mask) == ([1, 2, 3], [7, 8], [1, 1])
    assert record.completion_logprobs == [-0.5, -0.5]


def test_tokens_between_calls_are_environment_tokens_with_mask_zero():
    record = assemble([call([1, 2], [5, 6], version=3), call([1, 2, 5, 6, 40, 41], [9], version=4, logprob=-1.0)])
    assert record.completion_token_ids == [5, 6, 40, 41, 9]
    assert record.loss_mask == [1, 1, 0, 0, 1]
    assert record.completion_logprobs == [-0.5, -0.5, 0.0, 0.0, -1.0]
    assert [(s.version, s.start, s.end) for s in record.weight_versions] == [(3, 0, 2), (4, 4, 5)]
    assert record.branches == [0, 0]


def test_a_call_that_does_not_extend_the_history_opens_a_branch_and_stays_out_of_the_record():
    # The third call's history re-rendered token 6 as 60: it cannot be the same sequence.
    calls = [call([1, 2], [5, 6]), call([1, 2, 5, 6, 40], [9]), call([1, 2, 5, 60, 40, 9, 41], [11])]
    record = assemble(calls)
    assert record.completion_token_ids == [5, 6, 40, 9] and record.loss_mask == [1, 1, 0, 1]
    assert record.branches == [0, 0, 1]


def test_calls_that_cannot_extend_the_main_line_form_lines_of_their_own_and_are_counted():
    # a template that drops earlier reasoning: the second call's history lost token 6, the third extends the second
    calls = [call([1, 2], [5, 6, 7]), call([1, 2, 5, 7, 40], [9]), call([1, 2, 5, 7, 40, 9, 41], [11, 12])]
    record = assemble(calls)
    assert record.branches == [0, 1, 1]
    assert record.completion_token_ids == [5, 6, 7]  # the main line: the first call
    [line] = record.branch_sequences()
    assert line.prompt_token_ids == [1, 2, 5, 7, 40] and line.completion_token_ids == [9, 41, 11, 12]
    assert line.loss_mask == [1, 0, 1, 1] and [(s.start, s.end) for s in line.weight_versions] == [(0, 1), (2, 4)]
    assert record.metrics() == {"rollwire.branched_calls": 2.0, "rollwire.untrained_tokens": 3.0}
    assert record.metrics(branches_trained=True) == {"rollwire.branched_calls": 2.0, "rollwire.untrained_tokens": 0.0}


def test_a_call_that_extends_the_main_line_again_joins_it():
    calls = [call([1], [5]), call([9, 9], [6]), call([1, 5, 40], [7])]
    assert assemble(calls).branches == [0, 1, 0] and assemble(calls).completion_token_ids == [5, 40, 7]

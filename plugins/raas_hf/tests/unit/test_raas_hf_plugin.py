from astraflow.testing import assert_plugin_installed


def test_plugin_is_installed():
    assert_plugin_installed("raas_hf", "astraflow-plugin-raas-hf", "raas", "hf")



def test_long_prompts_are_batched_by_their_padded_tokens():
    """Four 35k-token prompts (an agent harness's) in one left-padded batch took 22 GB
    of attention mask; under ``max_batch_tokens`` each runs alone, short ones together."""
    from astraflow_raas_hf.batching import chunks

    lengths = [10, 10, 10, 10, 60, 400, 30, 20]
    cut = chunks(lengths, max_rows=3, max_tokens=100)
    assert cut == [[0, 1, 2], [3], [4], [5], [6, 7]]
    for chunk in cut:  # past the row limit or the token budget, never together
        widest = max(lengths[i] for i in chunk)
        assert len(chunk) <= 3 and (len(chunk) == 1 or widest * len(chunk) <= 100)
    assert chunks([5] * 7, max_rows=256, max_tokens=16384) == [list(range(7))]

"""README.md's "What a deep network gets": examples/opacus_cnn.py gives a CNN trained with Adam on a reshuffling
loader the every-iterate row of its sampler, names the departure, and shows Opacus' number NOT VALID beside it.
(That the README's output block is the example's output: tests/stories/test_docs_samples.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("opacus")
pytest.importorskip("sklearn")


def test_the_cnn_example_gets_the_every_iterate_row_beside_opacus_number():
    import lastiter_plugins as lp
    from tests.stories.docs_blocks import _script

    result = _script("examples/opacus_cnn.py").main()
    report = result["report"]
    expected = lp.epsilon("best", 1e-5, dataset_size=1500, batch_size=100, noise_multiplier=1.0, steps=45,
                          sampling="reshuffle", relation="replace_one", update="any")  # fmt: skip
    assert result["epsilon"] == expected.epsilon and result["winner"] == "composition-gdp-epochs"
    assert len(report.departures) == 1 and "torch.optim.Adam" in report.departures[0]
    prv = report.host[0]
    assert prv.startswith("Opacus' default accountant (prv)") and "NOT VALID" in prv
    assert result["accuracy"] > 0.5

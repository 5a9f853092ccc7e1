"""Loading models: the errors a user sees for a path or hub id that cannot be loaded."""

import pytest

from ngspec import models
from ngspec.errors import NgspecError


def test_a_directory_without_a_config_is_refused(tmp_path):
    with pytest.raises(NgspecError, match="is not a model directory"):
        models.load_model(str(tmp_path))


def test_an_unreachable_hub_says_what_to_do_offline():
    offline = OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the cached files.")
    assert "HF_HUB_OFFLINE=1" in models._offline_hint(offline) and "local model directory" in models._offline_hint(offline)
    assert models._offline_hint(OSError("nosuch/model is not a valid model identifier")) == ""  # reachable hub: its own message says it


def test_a_model_config_that_transformers_refuses_is_one_clear_line(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 512, "num_attention_heads": 9, "vocab_size": 100}))
    with pytest.raises(NgspecError, match=r"^could not load model '.*': The hidden size \(512\) is not a multiple of the number of attention heads \(9\)\.$"):
        models.load_model(str(tmp_path))

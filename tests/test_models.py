"""Loading models: the errors a user sees for a path or hub id that cannot be loaded."""

import re

import pytest
import torch

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


CUSTOM_CODE = '''
from transformers import LlamaConfig, LlamaForCausalLM


class OwnLlamaConfig(LlamaConfig):
    model_type = "ngspec-own-llama"


class OwnLlamaForCausalLM(LlamaForCausalLM):
    config_class = OwnLlamaConfig
'''


def _model_with_own_code(path):
    """A tiny Llama saved as a model that ships its own code (auto_map), with the default tokenizer."""
    import importlib.util

    import torch

    path.mkdir()
    (path / "own_llama.py").write_text(CUSTOM_CODE)
    spec = importlib.util.spec_from_file_location("own_llama_for_test", path / "own_llama.py")
    own = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(own)
    tok = models.load_tokenizer()
    config = own.OwnLlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    config.auto_map = {"AutoConfig": "own_llama.OwnLlamaConfig", "AutoModelForCausalLM": "own_llama.OwnLlamaForCausalLM"}
    torch.manual_seed(0)
    own.OwnLlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_a_model_with_its_own_code_runs_only_with_trust_remote_code(tmp_path):
    from typer.testing import CliRunner

    from ngspec.cli.app import app

    where = _model_with_own_code(tmp_path / "own")
    with pytest.raises(NgspecError, match=r"comes with its own Python code .*pass --trust-remote-code"):
        models.load_model(str(where), "cpu")
    assert type(models.load_model(str(where), "cpu", trust_remote_code=True).model).__name__ == "OwnLlamaForCausalLM"

    prompt = tmp_path / "p.txt"
    prompt.write_text("Repeat: one two three, one two three, one two three")
    args = ["generate", "-p", str(prompt), "-m", str(where), "-n", "12", "--device", "cpu", "--check", "--json"]
    refused = CliRunner().invoke(app, args, input="y\n")  # never asks: an answer on stdin changes nothing
    assert refused.exit_code == 1 and "--trust-remote-code" in refused.output and "Traceback" not in refused.output
    trusted = CliRunner().invoke(app, [*args, "--trust-remote-code"])
    assert trusted.exit_code == 0, trusted.output
    import json

    record = json.loads(trusted.stdout.strip().splitlines()[-1])
    assert record["greedy_check"]["exact_match"] and record["new_tokens"] == 12


def test_a_tokenizer_with_its_own_code_runs_only_with_trust_remote_code(tmp_path):
    """self-repetition and build-datastore load only the tokenizer: it is held to the same flag."""
    import json

    tok = models.load_tokenizer()
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(tok)}))
    (tmp_path / "own_tok.py").write_text("from transformers import PreTrainedTokenizerFast\n\n\nclass OwnTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    settings.update(tokenizer_class="OwnTokenizer", auto_map={"AutoTokenizer": [None, "own_tok.OwnTokenizer"]})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(NgspecError, match=r"^the tokenizer of '.*' comes with its own Python code .*--trust-remote-code"):
        models.load_tokenizer(str(tmp_path))
    assert type(models.load_tokenizer(str(tmp_path), trust_remote_code=True)).__name__ == "OwnTokenizer"


@pytest.mark.parametrize("device", ["gpu", "mps", "meta", "xla", "cuda:x", "cuda:", "CPU", " cpu", None, 0])
def test_a_device_ngspec_does_not_run_on_is_refused_by_name(device):
    """ngspec runs on a CPU or a CUDA GPU: any other device string ended in torch's RuntimeError
    ("Expected one of cpu, cuda, ipu, ...", "PyTorch is not linked with support for mps devices")
    or, for `meta`, in a crash at the first step."""
    with pytest.raises(NgspecError, match=r"^unknown device .*; choose auto, cpu, cuda or cuda:N$"):
        models.pick_device(device)


def test_cuda_is_refused_where_there_is_none_and_a_gpu_index_past_the_last(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NgspecError, match="^--device cuda:1 was asked for but CUDA is not available here$"):
        models.pick_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert models.pick_device("cuda:1") == torch.device("cuda:1") and models.pick_device("cuda") == torch.device("cuda")
    with pytest.raises(NgspecError, match=r"^--device cuda:2: this machine has 2 CUDA devices \(cuda:0 to cuda:1\)$"):
        models.pick_device("cuda:2")
    assert models.pick_device("cpu") == torch.device("cpu") and models.pick_device("auto") == torch.device("cuda")


TOKENIZER_FILES_NOTE = r"holds no tokenizer files \(tokenizer\.json, tokenizer_config\.json, tokenizer\.model, vocab\.json, \.\.\.\): copy them in from the model it was fine-tuned from"


def test_a_model_directory_without_a_tokenizer_says_so_in_one_line(tmp_path):
    """A checkpoint saved without its tokenizer ended in transformers' ValueError, five lines about
    sentencepiece and tiktoken."""
    models.tiny_model("llama").save_pretrained(tmp_path)
    with pytest.raises(NgspecError, match=rf"^the model directory {re.escape(str(tmp_path))} {TOKENIZER_FILES_NOTE}$"):
        models.load_model(str(tmp_path))


def test_a_model_directory_that_lost_its_tokenizer_json_says_which_file_to_copy(tmp_path):
    """input_fuzz run 15997: tokenizer_config.json left, tokenizer.json gone; transformers' message
    said to install sentencepiece or tiktoken, which would not help."""
    models.load_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(NgspecError, match=(
        rf"^the model directory {re.escape(str(tmp_path))} has no tokenizer.json, and transformers could not build its tokenizer "
        r"from the files it has \(tokenizer_config\.json\): copy tokenizer.json in from the model's source$"
    )):
        models.load_tokenizer(str(tmp_path))


def test_a_tokenizer_transformers_cannot_build_is_one_line_naming_the_model(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "NoSuchTokenizer"}')  # and no vocabulary beside it
    with pytest.raises(NgspecError) as err:
        models.load_tokenizer(str(tmp_path))
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value) and "sentencepiece" not in str(err.value)


def test_a_model_given_another_models_tokenizer_is_refused_as_it_loads(tmp_path):
    """Its ids ran past the embedding: `train-eagle` and `synth-corpus` ended in "IndexError: index
    out of range in self"."""
    models.tiny_model("llama").save_pretrained(tmp_path)
    models.load_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(NgspecError, match=r"^the tokenizer of '.*' has 49152 tokens but the model has embeddings for 96: they belong to different models"):
        models.load_model(str(tmp_path))


def test_a_model_transformers_cannot_load_for_generation_says_so_without_listing_every_type(tmp_path):
    """A T5 (encoder-decoder) directory: transformers' message lists every causal type it knows,
    3,000 characters on one line."""
    (tmp_path / "config.json").write_text('{"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}')
    with pytest.raises(NgspecError) as err:
        models.load_model(str(tmp_path))
    assert str(err.value) == (
        f"could not load model {str(tmp_path)!r}: transformers has no causal language model for its type, t5 (T5Config): "
        "ngspec drafts for decoder-only models (Llama, Qwen, Mistral, Gemma, Phi, GPT-2, ...)"
    )


DAMAGED = r"^could not load model '.*': its weights are damaged or cut short \(.+\); download or copy them again$"


@pytest.mark.parametrize("keep", [1000, 0.9])
def test_a_model_whose_weights_were_cut_short_says_so_in_one_line(tmp_path, keep):
    """An interrupted download: safetensors' "invalid header length" or "incomplete metadata, file
    not fully covered" came as an unexpected SafetensorError."""
    models.tiny_model("llama").save_pretrained(tmp_path)
    models.load_tokenizer().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    with pytest.raises(NgspecError, match=DAMAGED):
        models.load_model(str(tmp_path))


@pytest.mark.parametrize("keep", [10, 0.9])
def test_an_older_checkpoints_pytorch_model_bin_cut_short_says_so_in_one_line(tmp_path, keep):
    """torch's zip reader raises a RuntimeError of several sentences ("PytorchStreamReader failed
    reading zip archive: failed finding central directory. This is an internal miniz error. ..."),
    which came as an unexpected exception."""
    model = models.tiny_model("llama")
    model.save_pretrained(tmp_path)
    models.load_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    weights = tmp_path / "pytorch_model.bin"
    torch.save(model.state_dict(), weights)
    data = weights.read_bytes()
    weights.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    with pytest.raises(NgspecError, match=DAMAGED) as err:
        models.load_model(str(tmp_path))
    assert "(PytorchStreamReader failed reading zip archive: " in str(err.value) and "miniz" not in str(err.value)


def test_a_gguf_file_cut_short_says_so_in_one_line(tmp_path):
    """The start of the bundled model's GGUF: `struct.error: unpack_from requires a buffer ...`."""
    with models.embedded_gguf().open("rb") as whole:
        (tmp_path / "cut.gguf").write_bytes(whole.read(5000))
    with pytest.raises(NgspecError, match=DAMAGED):
        models.load_model(str(tmp_path / "cut.gguf"))


def test_a_gguf_file_named_in_capitals_is_read_as_a_gguf(tmp_path):
    """`MODEL.GGUF` was "is not a model directory (no config.json)"."""
    (tmp_path / "MODEL.GGUF").symlink_to(models.embedded_gguf())
    assert models._source(str(tmp_path / "MODEL.GGUF")) == (tmp_path, {"gguf_file": "MODEL.GGUF"})
    with pytest.raises(NgspecError, match="model file not found"):
        models._source(str(tmp_path / "OTHER.GGUF"))

def test_a_config_the_tokenizer_cannot_read_is_one_line_naming_the_model(tmp_path):
    """`build-datastore` and `self-repetition` load the tokenizer alone, which reads config.json:
    a field of the wrong type ended in an unexpected StrictDataclassFieldValidationError."""
    models.load_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama", "bos_token_id": ["a", 3]}')
    with pytest.raises(NgspecError, match=r"^could not load the tokenizer of '.*': bos_token_id must be a whole number or null, not \[\"a\", 3\]$") as err:
        models.load_tokenizer(str(tmp_path))
    assert "\n" not in str(err.value)


def test_a_tokenizer_file_the_tokenizers_library_refuses_is_one_line_naming_the_file(tmp_path):
    """tokenizers raises a bare Exception ("missing field `max_length` at line 1 column 40"): it
    came through as an unexpected exception, then without the file its line and column are in.
    (A part of another JSON type is refused before the library reads it.)"""
    import json

    models.load_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    data["truncation"] = {"猫": "猫猫猫"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(NgspecError, match=rf"^{re.escape(str(tmp_path / 'tokenizer.json'))} is damaged \(missing field `max_length` at line 1 column \d+\); copy it again"):
        models.load_tokenizer(str(tmp_path))


def _edited_tiny(path, name: str = "config.json", edit: dict | None = None, drop: str | None = None):
    """A tiny Llama saved at ``path`` with the default tokenizer, its JSON file ``name`` updated
    with ``edit`` (made when absent) and without field ``drop``."""
    import json

    models.tiny_model("llama").save_pretrained(path)
    models.load_tokenizer().save_pretrained(path)
    file = path / name
    doc = json.loads(file.read_text()) if file.is_file() else {}
    doc = {k: v for k, v in doc.items() if k != drop} | (edit or {})
    file.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return path


def test_weights_of_other_shapes_than_the_config_gives_are_one_line(tmp_path):
    """A config.json edited or swapped (here: without its vocab_size): transformers' RuntimeError
    pointed at a report it had not shown."""
    _edited_tiny(tmp_path, drop="vocab_size")
    with pytest.raises(NgspecError, match=r"^could not load model '.*': its weights' shapes differ from those its config.json gives \(.+\)$"):
        models.load_model(str(tmp_path))


@pytest.mark.parametrize(
    "edit, named",
    [
        ({"head_dim": -1}, "head_dim=-1"),  # transformers: "Trying to create tensor with negative dimension -4"
        ({"hidden_size": -8, "intermediate_size": 0}, "hidden_size=-8, intermediate_size=0"),
        ({"head_dim": 0}, "head_dim=0"),  # a ZeroDivisionError in the rotary embedding
        ({"num_hidden_layers": -1}, "num_hidden_layers=-1"),  # built a model of no layers
        ({"vocab_size": 2**63}, "vocab_size=9223372036854775808"),  # torch's C++ overflow error, whose last line is '"'
    ],
)
def test_layer_sizes_out_of_range_are_refused_naming_them(tmp_path, edit, named):
    """A config.json edited to a size below 1 (found by benchmarks/input_fuzz.py, run 7759) or past
    what a tensor's size can hold (run 9395): one line naming the sizes, before transformers builds
    anything."""
    _edited_tiny(tmp_path, edit=edit)
    with pytest.raises(NgspecError, match=rf"^could not load model '.*': its config gives {named}; a layer size must be a whole number from 1 to 2147483647$"):
        models.load_model(str(tmp_path))


@pytest.mark.parametrize("key, model_type", [("hidden_act", "llama"), ("hidden_activation", "gemma2"), ("activation_function", "gpt2")])
def test_an_activation_transformers_does_not_know_is_named(tmp_path, key, model_type):
    """A mistyped activation ended in a bare KeyError ('x') as transformers built the model."""
    import json

    tokenizer = models.load_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    config = {"model_type": model_type, "vocab_size": len(tokenizer), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "n_embd": 16, "n_layer": 1, "n_head": 2, key: "silly"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(NgspecError, match=rf'^could not load model \'.*\': its config gives {key}="silly", an activation transformers does not know \(silu, gelu, gelu_pytorch_tanh, relu, \.\.\.: \d+ in all\)$'):
        models.load_model(str(tmp_path))


@pytest.mark.parametrize(
    "name, content, problem, load",
    [
        ("config.json", b"5", "not a JSON object: 5", "model"),  # "argument of type 'int' is not iterable" (run 8494)
        ("config.json", b'{"model_type": ', "not valid JSON: Expecting value at line 1 column 16", "tokenizer"),
        ("generation_config.json", b"null", "not a JSON object: null", "model"),  # "'NoneType' object is not a mapping" (run 10086)
        ("tokenizer.json", b"[1, 2]", "not a JSON object: [1, 2]", "tokenizer"),  # "'list' object has no attribute 'pop'"
        ("tokenizer.json", b'{"a": 1}', "no added_tokens field", "tokenizer"),  # KeyError: "... of 'm': 'added_tokens'" (input_fuzz run 13770)
        ("tokenizer.json", b'{"added_tokens": []}', "no model field", "tokenizer"),  # the tokenizers library: "Model missing."
        ("tokenizer.json", b'{"added_tokens": [], "model": "ab', "not valid JSON: Unterminated string starting at line 1 column 31", "tokenizer"),  # "starting at at"
        ("tokenizer_config.json", b"\xef\xbb\xbf\x94{}", "not UTF-8 text: byte 3 is 0x94", "tokenizer"),  # a codec error naming no file
        ("chat_template.jinja", b"{{ x }}\xc3", "not UTF-8 text: byte 7 is 0xc3", "model"),
    ],
)
def test_a_model_file_that_is_not_json_or_text_is_named(tmp_path, name, content, problem, load):
    """A damaged JSON or template file in a model directory: transformers failed on it with a
    Python error that named no file ('int' object is not a mapping, a codec error)."""
    models.tiny_model("llama").save_pretrained(tmp_path)
    models.load_tokenizer().save_pretrained(tmp_path)
    (tmp_path / name).write_bytes(content)
    loader = models.load_model if load == "model" else models.load_tokenizer
    with pytest.raises(NgspecError, match=rf"^{re.escape(str(tmp_path / name))} is damaged \({re.escape(problem)}\); copy it again from the model's source$"):
        loader(str(tmp_path))


@pytest.mark.parametrize("name, load", [
    ("model.safetensors", "model"),  # transformers: "no file named model.safetensors, or pytorch_model.bin, found" (run 12964)
    ("tokenizer.json", "tokenizer"),  # transformers: "Couldn't instantiate the backend tokenizer ..." (run 13230)
    ("config.json", "model"),  # "is not a model directory (no config.json)"
    ("chat_template.jinja", "tokenizer"),
])
def test_a_directory_in_place_of_a_model_file_is_named(tmp_path, name, load):
    models.tiny_model("llama").save_pretrained(tmp_path)
    models.load_tokenizer().save_pretrained(tmp_path)
    (tmp_path / name).unlink()
    (tmp_path / name).mkdir()
    loader = models.load_model if load == "model" else models.load_tokenizer
    with pytest.raises(NgspecError) as err:
        loader(str(tmp_path))
    assert str(err.value) == f"{tmp_path / name} is a directory, not a file; copy it again from the model's source"


@pytest.mark.parametrize("part", ["normalizer", "pre_tokenizer", "model", "post_processor", "decoder"])
def test_a_tokenizer_part_of_a_kind_the_library_does_not_know_is_named(tmp_path, part):
    """The tokenizers library said 'data did not match any variant of untagged enum
    PyDecoderWrapper at line 1 column 2696': its own type's name for the part."""
    path = _edited_tiny(tmp_path, "tokenizer.json", {part: {"type": "Nope"}}) / "tokenizer.json"
    with pytest.raises(NgspecError, match=rf"^{re.escape(str(path))} is damaged \(its {part} is of no kind the tokenizers library reads, "
                                          rf"at line 1 column \d+\); copy it again from the model's source$"):
        models.load_tokenizer(str(tmp_path))


@pytest.mark.parametrize("left, says", [
    ([], ""),
    (["model.gguf"], "; it holds model.gguf: give that file itself as --model"),
    (["weights.pt"], "; it holds weights.pt"),
])
def test_a_model_directory_without_weights_is_named_in_ngspecs_words(tmp_path, left, says):
    """transformers said 'Error no file named model.safetensors, or pytorch_model.bin, found in
    directory m.' (input_fuzz run 14341); the tokenizer alone still loads from such a directory."""
    models.tiny_model("llama").save_pretrained(tmp_path)
    models.load_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    for name in left:
        (tmp_path / name).write_bytes(b"x")
    with pytest.raises(NgspecError) as err:
        models.load_model(str(tmp_path))
    assert str(err.value) == (f"{tmp_path} holds no model weights (model.safetensors, pytorch_model.bin, or a sharded model's "
                              f"index of them){says}; copy them again from the model's source")
    assert models.load_tokenizer(str(tmp_path)) is not None


@pytest.mark.slow
def test_converting_a_gguf_draws_no_bar_of_transformers_own(tmp_path, capfd):
    """The first run converts the bundled GGUF; transformers' plain tqdm bar for it ("Converting
    and de-quantizing GGUF tensors") used to print between ngspec's own lines."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    before = gguf_utils.tqdm
    out = models.convert_gguf(models.embedded_gguf(), tmp_path / "m")
    assert (out / "config.json").is_file()
    err = capfd.readouterr().err
    assert "GGUF" not in err and "%|" not in err, err
    assert gguf_utils.tqdm is before  # put back afterwards


@pytest.mark.parametrize(
    "name, edit, problem, load",
    [  # what transformers said, found by editing each field of the default model's files to each JSON type
        ("config.json", {"id2label": 5}, "id2label must be a JSON object or null, not 5", "model"),  # 'int' object has no attribute 'items'
        ("config.json", {"id2label": {"a": "x"}}, 'id2label\'s keys must be whole numbers (ids), not "a"', "model"),  # invalid literal for int()
        ("config.json", {"model_type": ["llama"]}, 'model_type must be a string, not ["llama"]', "tokenizer"),  # unhashable type: 'list'
        ("config.json", {"dtype": ["float32"]}, 'dtype must be a string, a JSON object or null, not ["float32"]', "model"),  # IndexError: list index out of range
        ("config.json", {"dtype": "auto"}, 'dtype must name a torch dtype (float32, bfloat16, float16, ...), not "auto"', "model"),  # module 'torch' has no attribute 'auto'
        ("config.json", {"quantization_config": "int8"}, 'quantization_config must be a JSON object or null, not "int8"', "model"),  # no attribute 'to_dict'
        ("config.json", {"num_labels": "2"}, 'num_labels must be a whole number, not "2"', "model"),  # cannot be interpreted as an integer
        ("tokenizer_config.json", {"tokenizer_class": 5}, "tokenizer_class must be a string or null, not 5", "tokenizer"),  # no attribute 'removesuffix'
        ("tokenizer_config.json", {"model_max_length": "8192"}, 'model_max_length must be a number or null, not "8192"', "model"),  # '>' not supported between instances
        ("tokenizer_config.json", {"added_tokens_decoder": None}, "added_tokens_decoder must be a JSON object, not null", "tokenizer"),
        ("tokenizer_config.json", {"eos_token": 2}, "eos_token must be a string, a JSON object or null, not 2", "tokenizer"),  # got: <class 'int'>
        ("tokenizer_config.json", {"bos_token": {"content": "<s>"}}, 'bos_token as a JSON object must be an AddedToken ({"__type": "AddedToken", "content": ...}), not {"content": "<s>"}', "tokenizer"),
        ("tokenizer_config.json", {"auto_map": ["tokenization_x.X"]}, 'auto_map as a list must name the tokenizer\'s two classes (slow, fast; one may be null), not ["tokenization_x.X"]', "tokenizer"),  # list index out of range
        ("tokenizer_config.json", {"added_tokens_decoder": {"0": 5}}, 'each entry of added_tokens_decoder must be a JSON object with the token\'s "content" string, not 5', "tokenizer"),  # Found a <class 'int'>
        ("tokenizer_config.json", {"added_tokens_decoder": {"x": {"content": "<a>"}}}, 'added_tokens_decoder\'s keys must be whole numbers (ids), not "x"', "tokenizer"),
        ("special_tokens_map.json", {"eos_token": [2]}, "eos_token must be a string, a JSON object or null, not [2]", "tokenizer"),  # got: <class 'list'>
        # "Special token a has to be either str or AddedToken but got: <class 'int'>" (noted by benchmarks/field_sweep.py)
        ("tokenizer_config.json", {"extra_special_tokens": {"a": 5}}, "each entry of extra_special_tokens must be a string or a token's JSON object, not 5", "tokenizer"),
        ("tokenizer_config.json", {"additional_special_tokens": [None]}, "each entry of additional_special_tokens must be a string or a token's JSON object, not null", "tokenizer"),
        ("special_tokens_map.json", {"extra_special_tokens": {"a": {"content": "<a>"}}}, 'each token named in extra_special_tokens must be a string or an AddedToken ({"__type": "AddedToken", "content": ...}), not {"content": "<a>"}', "tokenizer"),
        # "extra_special_tokens must be a list/tuple of tokens or a dict of named tokens", naming the other field
        ("special_tokens_map.json", {"additional_special_tokens": {}}, "additional_special_tokens must be a list or null, not {}", "tokenizer"),
        ("tokenizer_config.json", {"additional_special_tokens": "x"}, 'additional_special_tokens must be a list, a JSON object or null, not "x"', "tokenizer"),
        ("tokenizer.json", {"added_tokens": "猫"}, 'added_tokens must be a list, not "猫"', "tokenizer"),  # 'str' object has no attribute 'pop'
        ("tokenizer.json", {"added_tokens": [{"content": "<a>"}]}, 'each entry of added_tokens must be a JSON object with its "id" number and "content" string, not {"content": "<a>"}', "tokenizer"),  # KeyError 'id'
        ("generation_config.json", {"eos_token_id": [2, "x"]}, 'each entry of eos_token_id must be a whole number, not "x"', "model"),  # ValueError in ngspec's EOS lookup
        # a null entry passed the check, whose "none found" was None too
        ("generation_config.json", {"eos_token_id": [2, None]}, "each entry of eos_token_id must be a whole number, not null", "model"),
        ("tokenizer_config.json", {"added_tokens_decoder": {"0": None}}, 'each entry of added_tokens_decoder must be a JSON object with the token\'s "content" string, not null', "tokenizer"),
        ("generation_config.json", {"pad_token_id": "2"}, 'pad_token_id must be a whole number or null, not "2"', "model"),  # '<' not supported between instances
        # the tokenizers library's serde words: "data did not match any variant of untagged enum PyDecoderWrapper" (input_fuzz run 14258)
        ("tokenizer.json", {"decoder": []}, "decoder must be a JSON object or null, not []", "tokenizer"),
        ("tokenizer.json", {"post_processor": "猫猫猫"}, 'post_processor must be a JSON object or null, not "猫猫猫"', "tokenizer"),  # run 14366
        ("tokenizer.json", {"model": None}, "model must be a JSON object, not null", "tokenizer"),
        ("tokenizer.json", {"truncation": 5}, "truncation must be a JSON object or null, not 5", "tokenizer"),  # "expected struct TruncationParams"
        ("tokenizer.json", {"version": {"a": 1}}, 'version must be a string, not {"a": 1}', "tokenizer"),  # "invalid type: map, expected a string" (run 14451)
    ],
)
def test_a_model_file_field_of_another_type_is_named(tmp_path, name, edit, problem, load):
    """A field transformers reads without checking its type, edited to another: transformers failed
    with a Python error naming neither the field nor the file."""
    path = _edited_tiny(tmp_path, name, edit) / name
    loader = models.load_model if load == "model" else models.load_tokenizer
    with pytest.raises(NgspecError, match=rf"^{re.escape(str(path))} is damaged \({re.escape(problem)}\); copy it again from the model's source$"):
        loader(str(tmp_path))


def test_every_field_of_a_right_type_loads(tmp_path):
    """The table refuses only other types: each field at a value of each type it allows loads."""
    import json

    tokenizer = models.load_tokenizer()
    models.tiny_model("llama", vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"id2label": {"0": "a", "1": "b"}, "dtype": "bfloat16", "torch_dtype": None, "num_labels": 2, "quantization_config": None}))
    tok = json.loads((tmp_path / "tokenizer_config.json").read_text())
    added = {"__type": "AddedToken", "content": "<|im_start|>", "special": True}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tok | {"tokenizer_class": None, "model_max_length": 1e30, "pad_token": None,
                                                                      "extra_special_tokens": {"a": "<|im_start|>", "b": added}, "additional_special_tokens": [added]}))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}, "additional_special_tokens": ["<|im_start|>"],
                                                                  "extra_special_tokens": {"a": "<|im_start|>"}}))
    loaded = models.load_model(str(tmp_path))
    assert loaded.model.config.id2label == {0: "a", 1: "b"}


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"attention_bias": 5}, "attention_bias must be true or false, not 5"),
        ({"rms_norm_eps": "small"}, 'rms_norm_eps must be a number, not "small"'),
        ({"eos_token_id": "x"}, 'eos_token_id must be a whole number, a list or null, not "x"'),
        ({"rope_parameters": 5}, "rope_parameters must be a JSON object or null, not 5"),  # a TypedDict among its types
        ({"pretraining_tp": float("nan")}, "pretraining_tp must be a whole number or null, not NaN"),  # Python's repr said nan
    ],
)
def test_a_field_transformers_validates_is_refused_in_jsons_words(tmp_path, edit, message):
    """transformers' own validation named the field in Python's words ("TypeError: Field
    'attention_bias' expected bool, got int (value: 5)", "<class 'NoneType'>")."""
    _edited_tiny(tmp_path, edit=edit)
    with pytest.raises(NgspecError, match=rf"^could not load model '.*': {re.escape(message)}$"):
        models.load_model(str(tmp_path))


@pytest.mark.parametrize("key, value", [("text_config", 5), ("text_config", {"a": 1}), ("decoder", "x"), ("generator", [1])])
def test_a_text_models_config_in_a_family_without_one_is_named(tmp_path, key, value):
    """transformers reads these keys as a sub-model's config and called .to_dict() on them as it
    built the model: "'int' object has no attribute 'to_dict'" (noted by benchmarks/field_sweep.py)."""
    _edited_tiny(tmp_path, edit={key: value})
    with pytest.raises(NgspecError, match=rf"^could not load model '.*': its config gives {key}=\S.*, which transformers reads as the "
                                          r"config of a text model inside this one, and a llama config has none: remove it$"):
        models.load_model(str(tmp_path))


def test_a_model_type_transformers_does_not_know_says_so_not_only_how_to_upgrade(tmp_path):
    """transformers' message ends in advice to upgrade; its last line was all ngspec showed."""
    (tmp_path / "config.json").write_text('{"model_type": "llama9"}')
    models.load_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(NgspecError, match=r"^could not load model '.*': transformers \S+ does not know its model type, 'llama9': a newer transformers may"):
        models.load_model(str(tmp_path))


@pytest.mark.parametrize(
    "name, edit, says",
    [
        ("tokenizer_config.json", {"tokenizer_class": 5}, "tokenizer_config.json is damaged (tokenizer_class must be a string or null, not 5)"),
        ("config.json", {"attention_bias": 5}, "attention_bias must be true or false, not 5"),
        ("config.json", {"hidden_act": "x"}, "its config gives hidden_act=\"x\", an activation transformers does not know"),  # was error: KeyError
    ],
)
def test_generate_refuses_an_edited_model_file_in_one_line_with_exit_code_1(tmp_path, name, edit, says):
    """The CLI end of the checks above: one error line naming the field, exit code 1, no traceback."""
    from typer.testing import CliRunner

    from ngspec.cli.app import app

    _edited_tiny(tmp_path / "m", name, edit)
    prompt = tmp_path / "p.txt"
    prompt.write_text("Name three colours.")
    result = CliRunner().invoke(app, ["generate", "-p", str(prompt), "-m", str(tmp_path / "m"), "-n", "2", "--device", "cpu"])
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 1 and len(errors) == 1 and says in errors[0], result.output
    assert "Traceback" not in result.output and "NGSPEC_DEBUG" not in result.output

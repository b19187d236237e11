"""Model configurations (OgaCreateConfig, OgaConfigOverlay, provider edits, OgaExtConfigGetJson),
genai_config.json decoder parsing and the state_groups manifest, model loading through the
registered loader (OgaCreateModel, OgaCreateModelFromConfig, OgaExtSetModelLoader), and automatic
KV-cache sizing from gpu_utilization_factor. Error texts that OGA 0.18 shares are pinned to its
texts (and compared with onnxruntime_genai 0.18 itself where it is installed)."""

import copy
import ctypes
import json
import os
import re
import subprocess
import sys
from ctypes import POINTER, Structure, byref, c_char_p, c_int32, c_size_t, c_uint32, c_void_p

import pytest

import oga as og
from capi import Handles, P, error, lib, ok  # noqa: F401 (lib is a fixture)
from test_executor_interface import Executor, PyExecutor

NO_LOADER = ("No model loader is registered: import the oga Python package (it registers the ONNX Runtime "
             "executor) before calling OgaCreateModel.")
BUDGET = "The key-value cache budget is too small to hold the reserved decoder state."
FIXED_KIND = ("model:decoder:state_groups:kind:Decoder state group kind 'fixed' is no longer supported; use "
              "'fixed_conv' or 'fixed_recurrent' and move binding templates to model.decoder.inputs and "
              "model.decoder.outputs")
LEGACY_BINDINGS = ("model:decoder:state_groups:bindings:Legacy decoder state group bindings are no longer "
                   "supported; move binding templates to model.decoder.inputs and model.decoder.outputs")


def base_config():
    """A paged decoder config shaped like OGA's builder output (4 layers; the test executor runs it)."""
    return {
        "model": {
            "type": "llama", "vocab_size": 64, "context_length": 128, "eos_token_id": [1], "bos_token_id": 0,
            "pad_token_id": 0,
            "decoder": {
                "filename": "model.onnx", "head_size": 1, "hidden_size": 1, "num_attention_heads": 1,
                "num_hidden_layers": 4, "num_key_value_heads": 1,
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "inputs": {"input_ids": "input_ids", "cumulative_sequence_lengths": "cumulative_sequence_lengths",
                           "past_sequence_lengths": "past_sequence_lengths", "block_table": "block_table",
                           "attention_metadata": "attention_metadata",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {"max_length": 128, "do_sample": False, "num_beams": 1, "min_length": 0},
        "engine": {"dynamic_batching": {"block_size": 4, "num_blocks": 64, "max_batch_size": 4}},
    }


def write_config(directory, cfg):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "genai_config.json"
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return path


def create_config(lib, path):
    cfg = P()
    msg = error(lib, lib.OgaCreateConfig(os.fsencode(str(path)), byref(cfg)))
    if msg is not None:
        assert not cfg.value
        return None, msg
    assert cfg.value
    return cfg, None


def config_json(lib, cfg):
    out = c_char_p()
    ok(lib, lib.OgaExtConfigGetJson(cfg, byref(out)))
    return out.value.decode()


def with_groups(groups, **decoder):
    cfg = base_config()
    cfg["model"]["decoder"]["state_groups"] = groups
    cfg["model"]["decoder"].update(decoder)
    return cfg


# ---------------------------------------------------------------------------------------------
# Loader plumbing (ctypes twin of OgaExtDecoderNames / OgaExtModelLoader)
# ---------------------------------------------------------------------------------------------
NAME_FIELDS = ["model_directory", "config_json", "decoder_filename", "input_ids", "position_ids",
               "cumulative_sequence_lengths", "past_sequence_lengths", "block_table", "block_table_windowed",
               "attention_metadata", "attention_mask", "logits_indices", "logits"]
LIST_FIELDS = ["past_key_names", "past_value_names", "present_key_names", "present_value_names"]


class FixedStateNames(Structure):
    _fields_ = [("kind", c_uint32), ("layer_id", c_int32), ("input", c_char_p), ("output", c_char_p)]


SIZE_FIELDS = ("num_key_value_heads", "head_size", "num_hidden_layers", "num_blocks")


class DecoderNames(Structure):
    _fields_ = ([(n, c_char_p) for n in NAME_FIELDS] + [("num_paged_layers", c_size_t),
                                                        ("paged_layer_ids", POINTER(c_int32))]
                + [(n, POINTER(c_char_p)) for n in LIST_FIELDS] + [("block_size", c_size_t), ("vocab_size", c_size_t)]
                + [("num_fixed_states", c_size_t), ("fixed_states", POINTER(FixedStateNames)),
                   ("num_sliding_window_layers", c_size_t), ("sliding_window_layers", POINTER(c_int32))]
                + [(n, c_size_t) for n in SIZE_FIELDS] + [("session_options_json", c_char_p)])


LOADER = ctypes.CFUNCTYPE(c_uint32, POINTER(DecoderNames), POINTER(Executor), c_void_p, c_size_t)


MEMORY_INFO = ctypes.CFUNCTYPE(c_int32, c_void_p, POINTER(c_size_t), POINTER(c_size_t), c_void_p, c_size_t)


class DeviceOps(Structure):
    """OgaExtDeviceOps; only memory_info is set here."""
    _fields_ = [("context", c_void_p)] + [(n, c_void_p) for n in (
        "allocate", "release", "copy", "fill_zero", "synchronize", "read", "sample")] + [("memory_info", MEMORY_INFO)]


class FakeLoader:
    """Records the names it is handed and returns a PyExecutor (or fails with `fail`)."""

    def __init__(self, bytes_per_block=0, fail=None, release_on_fail=False, device_memory=None):
        self.calls = []
        self.bytes_per_block = bytes_per_block
        # (free, total) bytes or an error text: an OgaExtDeviceOps table with only memory_info
        self.device_memory = device_memory
        self.device_ops = None
        if device_memory is not None:
            self.c_memory_info = MEMORY_INFO(self._memory_info)
            self.device_ops = DeviceOps(memory_info=self.c_memory_info)
        self.fail = fail
        self.release_on_fail = release_on_fail
        self.executor = PyExecutor()
        self.c_loader = LOADER(self._load)
        self.error = None

    def _load(self, names, executor, message, capacity):
        try:
            n = names.contents
            got = {f: getattr(n, f).decode() for f in NAME_FIELDS}
            count = n.num_paged_layers
            got["paged_layer_ids"] = [n.paged_layer_ids[i] for i in range(count)]
            for f in LIST_FIELDS:
                got[f] = [getattr(n, f)[i].decode() for i in range(count)]
            got["block_size"], got["vocab_size"] = n.block_size, n.vocab_size
            got["fixed_states"] = [(n.fixed_states[i].kind, n.fixed_states[i].layer_id,
                                    n.fixed_states[i].input.decode(), n.fixed_states[i].output.decode())
                                   for i in range(n.num_fixed_states)]
            got["sliding_window_layers"] = [n.sliding_window_layers[i] for i in range(n.num_sliding_window_layers)]
            for f in SIZE_FIELDS:
                got[f] = getattr(n, f)
            got["session_options"] = json.loads(n.session_options_json.decode())
            self.calls.append(got)
            ex = self.executor
            table = executor.contents
            table.per_token_logits = 0
            table.max_block_table_columns = 0
            table.bytes_per_block = self.bytes_per_block
            table.model_data = 77
            table.open_engine, table.execute = ex.c_open, ex.c_execute
            table.close_engine, table.release_model = ex.c_close, ex.c_release
            if self.device_ops is not None:
                table.device_ops = ctypes.addressof(self.device_ops)
            if self.fail is not None:
                if not self.release_on_fail:
                    table.release_model = type(ex.c_release)()  # NULL
                data = self.fail.encode()[: capacity - 1] + b"\0"
                ctypes.memmove(message, data, len(data))
                return 3
            return 0
        except Exception as exc:  # noqa: BLE001
            self.error = exc
            return 3


    def _memory_info(self, context, free, total, message, capacity):
        if isinstance(self.device_memory, str):
            data = self.device_memory.encode()[: capacity - 1] + b"\0"
            ctypes.memmove(message, data, len(data))
            return 1
        free[0], total[0] = self.device_memory
        return 0


def restore_loader(lib):
    """Puts back the package's own loader (registered when oga is imported)."""
    og._core._register_callbacks(og._executor, og._tokenizer)


@pytest.fixture
def loader(lib):
    holder = {}

    def install(**kw):
        fake = FakeLoader(**kw)
        holder["fake"] = fake  # the callback must outlive its registration
        lib.OgaExtSetModelLoader(ctypes.cast(fake.c_loader, c_void_p))
        return fake

    yield install
    restore_loader(lib)
    holder.clear()


@pytest.fixture
def no_loader(lib):
    lib.OgaExtSetModelLoader(None)
    yield
    restore_loader(lib)


def load_model(lib, path):
    model = P()
    msg = error(lib, lib.OgaCreateModel(os.fsencode(str(path)), byref(model)))
    if msg is not None:
        assert not model.value
        return None, msg
    return model, None


# ---------------------------------------------------------------------------------------------
# Creating configs, JSON round trip
# ---------------------------------------------------------------------------------------------
def test_config_from_directory_or_file_round_trips(lib, tmp_path):
    cfg = base_config()
    cfg["model"]["decoder"]["pipeline"] = [{"stage": {"filename": "x.onnx", "run_on_token_gen": True}}]
    cfg["model"]["note"] = "caf\u00e9 \u2603 \U0001F600 \"q\" \\ \n\t\u0001"
    cfg["search"].update(top_p=0.9, temperature=1e-3, repetition_penalty=1.0, top_k=0, random_seed=-1)
    cfg["extra"] = {"nested": [1, -2, 3.5, None, True, False, [], {}], "big": 2 ** 62, "tiny": 5e-324}
    path = write_config(tmp_path / "m", cfg)
    for where in (tmp_path / "m", path, str(tmp_path / "m") + "/"):
        handle, msg = create_config(lib, where)
        assert msg is None, msg
        text = config_json(lib, handle)
        assert json.loads(text) == cfg
        assert text == json.dumps(cfg, separators=(",", ":"), ensure_ascii=False)  # compact, same order
        # Serialised text parses back to the same text.
        write_config(tmp_path / "again", text)
        again, msg = create_config(lib, tmp_path / "again")
        assert msg is None and config_json(lib, again) == text
        lib.OgaDestroyConfig(again)
        lib.OgaDestroyConfig(handle)


def test_float_values_keep_their_kind(lib, tmp_path):
    cfg = base_config()
    cfg["search"]["temperature"] = 2.0
    cfg["search"]["top_p"] = 0.1
    handle, _ = create_config(lib, write_config(tmp_path, cfg))
    text = config_json(lib, handle)
    assert '"temperature":2.0' in text and '"top_p":0.1' in text and '"max_length":128' in text
    lib.OgaDestroyConfig(handle)


def test_missing_config_file(lib, tmp_path):
    _, msg = create_config(lib, tmp_path)
    assert msg == f"Error opening {tmp_path}/genai_config.json"
    _, msg = create_config(lib, tmp_path / "nope")
    assert msg == f"Error opening {tmp_path}/nope/genai_config.json"


def test_parse_errors_name_the_file(lib, tmp_path):
    path = write_config(tmp_path, '{"engine": {"dynamic_batching": {"max_scheduled_tokens": 0}}}')
    _, msg = create_config(lib, tmp_path)
    assert msg == f"Error encountered while parsing '{path}' JSON Error: max_scheduled_tokens must be > 0 at line 1 index 58"
    write_config(tmp_path, '{"model": ')
    _, msg = create_config(lib, tmp_path)
    assert msg.startswith(f"Error encountered while parsing '{path}' JSON Error: ")
    assert msg.endswith("at line 1 index 10")


def test_create_config_rejects_null_arguments(lib, tmp_path):
    out = P()
    assert error(lib, lib.OgaCreateConfig(None, byref(out))) == "config_path must not be null."
    write_config(tmp_path, base_config())
    assert error(lib, lib.OgaCreateConfig(os.fsencode(str(tmp_path)), None)) == "out must not be null."
    assert error(lib, lib.OgaConfigOverlay(None, b"{}")) == "config must not be null."
    assert error(lib, lib.OgaExtConfigGetJson(None, byref(c_char_p()))) == "config must not be null."
    assert error(lib, lib.OgaCreateModelFromConfig(None, byref(out))) == "config must not be null."


# ---------------------------------------------------------------------------------------------
# Overlays
# ---------------------------------------------------------------------------------------------
def test_overlay_merges_objects_and_replaces_other_values(lib, tmp_path):
    cfg = base_config()
    cfg["model"]["decoder"]["state_groups"] = [{"kind": "paged_kv", "layer_ids": [0, 1]}]
    handle, _ = create_config(lib, write_config(tmp_path, cfg))
    ok(lib, lib.OgaConfigOverlay(handle, json.dumps({
        "search": {"max_length": 64},
        "engine": {"dynamic_batching": {"max_batch_size": 2, "prefix_caching": False}},
        "model": {"decoder": {"state_groups": [{"kind": "paged_kv", "layer_ids": [3]}],
                              "inputs": {"logits_indices": "logits_indices"}}},
        "speculative": {"anything": [1, 2]},
    }).encode()))
    got = json.loads(config_json(lib, handle))
    expected = copy.deepcopy(cfg)
    expected["search"]["max_length"] = 64
    expected["engine"]["dynamic_batching"].update(max_batch_size=2, prefix_caching=False)
    expected["model"]["decoder"]["state_groups"] = [{"kind": "paged_kv", "layer_ids": [3]}]
    expected["model"]["decoder"]["inputs"]["logits_indices"] = "logits_indices"
    expected["speculative"] = {"anything": [1, 2]}
    assert got == expected
    # Key order: existing keys stay in place, new keys are appended.
    assert list(got["engine"]["dynamic_batching"]) == ["block_size", "num_blocks", "max_batch_size", "prefix_caching"]
    lib.OgaDestroyConfig(handle)


OVERLAY_ERRORS = [
    ('{"engine": {"dynamic_batching": {"max_scheduled_tokens": 0}}}',
     "JSON Error: max_scheduled_tokens must be > 0 at line 1 index 58"),
    ('{"engine": {"dynamic_batching": {"foo": 1}}}',
     'JSON Error: engine:dynamic_batching: Unknown value "foo" at line 1 index 41'),
    ('{"model": {"decoder": {"state_groups": []}}}', "model.decoder.state_groups must not be empty"),
    ('{"model": {"decoder": {"state_groups": [{"kind": "paged_kv", "layer_ids": [1,1]}]}}}',
     "model.decoder.state_groups[0] (paged_kv) contains duplicate layer_id 1"),
    ('{"model": {"decoder": {"state_groups": [{"kind": "fixed", "layer_ids": [1]}]}}}',
     f"JSON Error: {FIXED_KIND} at line 1 index 56"),
    ('{"model": {"decoder": {"state_groups": [{"kind": "fixed_conv", "layer_ids": [0], "bindings": {}}]}}}',
     f"JSON Error: {LEGACY_BINDINGS} at line 1 index 94"),
    ('{"model": {"foo": 1}}', None),  # model keys outside the engine core are tolerated
    ('{"model": {"vocab_size": 0}}', "vocab_size must be 1 or greater, is 0"),
    ('{"model": {"decoder": {"inputs": {"past_key_names": "k"}, "state_groups": [{"kind": "paged_kv", '
     '"layer_ids": [0]}]}}}',
     "model.decoder.state_groups[0] (paged_kv) binding 'key' has malformed input template 'k'; expected exactly one %d"),
]


@pytest.mark.parametrize("overlay,expected", OVERLAY_ERRORS)
def test_overlay_failure_changes_nothing(lib, tmp_path, overlay, expected):
    handle, _ = create_config(lib, write_config(tmp_path, base_config()))
    before = config_json(lib, handle)
    msg = error(lib, lib.OgaConfigOverlay(handle, overlay.encode()))
    assert msg == expected
    if expected is not None:
        assert config_json(lib, handle) == before
    lib.OgaDestroyConfig(handle)


def test_overlay_syntax_error_points_into_the_overlay(lib, tmp_path):
    handle, _ = create_config(lib, write_config(tmp_path, base_config()))
    before = config_json(lib, handle)
    msg = error(lib, lib.OgaConfigOverlay(handle, b'{\n  "search": {"max_length": 12,}\n}'))
    assert re.fullmatch(r"JSON Error: .* at line 2 index \d+", msg), msg
    assert error(lib, lib.OgaConfigOverlay(handle, b"[1]")).startswith("JSON Error: ")
    assert config_json(lib, handle) == before
    lib.OgaDestroyConfig(handle)


def test_failed_overlay_keeps_earlier_overlays(lib, tmp_path):
    handle, _ = create_config(lib, write_config(tmp_path, base_config()))
    ok(lib, lib.OgaConfigOverlay(handle, b'{"search": {"max_length": 50}}'))
    assert error(lib, lib.OgaConfigOverlay(handle, b'{"search": {"max_length": 40, "top_k": "x"}}'))
    assert json.loads(config_json(lib, handle))["search"]["max_length"] == 50
    lib.OgaDestroyConfig(handle)


# ---------------------------------------------------------------------------------------------
# Providers
# ---------------------------------------------------------------------------------------------
def providers_of(lib, handle):
    return json.loads(config_json(lib, handle))["model"]["decoder"]["session_options"]["provider_options"]


def test_provider_edits_are_visible_in_the_effective_json(lib, tmp_path):
    cfg = base_config()
    cfg["model"]["decoder"]["session_options"]["provider_options"] = [{"cuda": {"enable_cuda_graph": "0"}}]
    handle, _ = create_config(lib, write_config(tmp_path, cfg))
    ok(lib, lib.OgaConfigSetProviderOption(handle, b"cuda", b"enable_cuda_graph", b"1"))
    ok(lib, lib.OgaConfigSetProviderOption(handle, b"cuda", b"device_id", b"0"))
    assert providers_of(lib, handle) == [{"cuda": {"enable_cuda_graph": "1", "device_id": "0"}}]
    ok(lib, lib.OgaConfigClearProviders(handle))
    assert providers_of(lib, handle) == []
    ok(lib, lib.OgaConfigAppendProvider(handle, b"CUDAExecutionProvider"))
    ok(lib, lib.OgaConfigAppendProvider(handle, b"CUDAExecutionProvider"))  # once only
    ok(lib, lib.OgaConfigAppendProvider(handle, b"cpu"))
    ok(lib, lib.OgaConfigSetProviderOption(handle, b"webgpu", b"k", b"v \"quoted\""))
    assert providers_of(lib, handle) == [{"CUDAExecutionProvider": {}}, {"cpu": {}}, {"webgpu": {"k": 'v "quoted"'}}]
    assert json.loads(config_json(lib, handle))["model"]["decoder"]["session_options"]["log_id"] == "onnxruntime-genai"
    assert error(lib, lib.OgaConfigAppendProvider(handle, b"")) == "provider must not be empty."
    assert error(lib, lib.OgaConfigSetProviderOption(handle, b"cuda", None, b"1")) == "key must not be null."
    lib.OgaDestroyConfig(handle)


def test_provider_edits_create_missing_sections(lib, tmp_path):
    cfg = base_config()
    del cfg["model"]["decoder"]["session_options"]
    handle, _ = create_config(lib, write_config(tmp_path, cfg))
    ok(lib, lib.OgaConfigAppendProvider(handle, b"cuda"))
    assert json.loads(config_json(lib, handle))["model"]["decoder"]["session_options"] == {
        "provider_options": [{"cuda": {}}]}
    lib.OgaDestroyConfig(handle)


# ---------------------------------------------------------------------------------------------
# Decoder parsing and the state_groups manifest
# ---------------------------------------------------------------------------------------------
STATE_GROUP_ERRORS = [
    ([], "model.decoder.state_groups must not be empty"),
    ([{"kind": "paged_kv", "layer_ids": []}], "model.decoder.state_groups[0] (paged_kv) must contain at least one layer_id"),
    ([{"kind": "paged_kv"}], "model.decoder.state_groups[0] (paged_kv) must contain at least one layer_id"),
    ([{"kind": "paged_kv", "layer_ids": [0, 4]}],
     "model.decoder.state_groups[0] (paged_kv) has layer_id 4 outside [0, num_hidden_layers)"),
    ([{"kind": "paged_kv", "layer_ids": [-1]}],
     "model.decoder.state_groups[0] (paged_kv) has layer_id -1 outside [0, num_hidden_layers)"),
    ([{"kind": "paged_kv", "layer_ids": [1, 1]}], "model.decoder.state_groups[0] (paged_kv) contains duplicate layer_id 1"),
    ([{"layer_ids": [0, 0], "kind": "paged_kv"}], "model.decoder.state_groups[0] (paged_kv) contains duplicate layer_id 0"),
    ([{"kind": "paged_kv", "layer_ids": [0, 1]}, {"kind": "paged_kv", "layer_ids": [1, 2]}],
     "model.decoder.state_groups[1] (paged_kv) overlaps another paged_kv group at layer_id 1"),
    ([{"kind": "paged_kv", "layer_ids": [0], "state_update": {}}],
     "model.decoder.state_groups[0] (paged_kv) only fixed state groups support state_update"),
    ([{"layer_ids": [0]}], "model.decoder.state_groups[0] (invalid) is missing kind"),
    ([{"kind": "paged_kv", "layer_ids": [3]}, {"kind": "fixed_conv", "layer_ids": [0], "state_update": {"capacity": 4}},
      {"kind": "fixed_recurrent", "layer_ids": [0]}],
     "All fixed state groups must declare state_update when any fixed group declares it"),
]


def check_template_cases():
    cases = []

    def case(groups, expected, inputs=None, outputs=None):
        cfg = with_groups(groups)
        cfg["model"]["decoder"]["inputs"].update(inputs or {})
        cfg["model"]["decoder"]["outputs"].update(outputs or {})
        cases.append((cfg, expected))

    paged0 = [{"kind": "paged_kv", "layer_ids": [0]}]
    case(paged0, "model.decoder.state_groups[0] (paged_kv) binding 'key' has malformed input template "
         "'past_key_values.key'; expected exactly one %d", inputs={"past_key_names": "past_key_values.key"})
    case(paged0, "model.decoder.state_groups[0] (paged_kv) binding 'key' has malformed input template "
         "'past_key_values.%d.%d'; expected exactly one %d", inputs={"past_key_names": "past_key_values.%d.%d"})
    case(paged0, "model.decoder.state_groups[0] (paged_kv) binding 'value' has malformed output template "
         "'present.value'; expected exactly one %d", outputs={"present_value_names": "present.value"})
    case([{"kind": "paged_kv", "layer_ids": [3]}, {"kind": "fixed_conv", "layer_ids": [0]}],
         "model.decoder.state_groups[1] (fixed_conv) binding 'state' has malformed input template 'conv'; expected "
         "exactly one %d", inputs={"past_conv_names": "conv"})
    case([{"kind": "paged_kv", "layer_ids": [3]}, {"kind": "fixed_recurrent", "layer_ids": [0]}],
         "model.decoder.state_groups[1] (fixed_recurrent) binding 'state' has malformed output template 'rec'; "
         "expected exactly one %d", outputs={"present_recurrent_names": "rec"})
    case(paged0, "model.decoder.state_groups[0] (paged_kv) resolves more than one binding to 'past_key_values.0.key'",
         inputs={"past_value_names": "past_key_values.%d.key"})
    case(paged0, "model.decoder.state_groups[0] (paged_kv) resolves more than one binding to 'past_key_values.0.key'",
         outputs={"present_key_names": "past_key_values.%d.key"})
    case([{"kind": "paged_kv", "layer_ids": [0]}, {"kind": "fixed_conv", "layer_ids": [0]}],
         "model.decoder.state_groups[1] (fixed_conv) resolves more than one binding to 'past_key_values.0.key'",
         inputs={"past_conv_names": "past_key_values.%d.key"})
    no_layers = with_groups([{"kind": "paged_kv", "layer_ids": [0]}])
    del no_layers["model"]["decoder"]["num_hidden_layers"]
    cases.append((no_layers, "model.decoder.state_groups[0] (paged_kv) has layer_id 0 outside [0, num_hidden_layers)"))
    return cases


ALL_STATE_GROUP_CASES = [(with_groups(g), e) for g, e in STATE_GROUP_ERRORS] + check_template_cases()


@pytest.mark.parametrize("cfg,expected", ALL_STATE_GROUP_CASES)
def test_state_group_validation_messages(lib, tmp_path, cfg, expected):
    _, msg = create_config(lib, write_config(tmp_path, cfg))
    assert msg == expected
    if "num_hidden_layers" not in cfg["model"]["decoder"]:
        return  # an overlay cannot remove a key
    # The same manifest as an overlay: same text, and nothing published.
    handle, _ = create_config(lib, write_config(tmp_path / "ok", base_config()))
    before = config_json(lib, handle)
    assert error(lib, lib.OgaConfigOverlay(handle, json.dumps({"model": cfg["model"]}).encode())) == expected
    assert config_json(lib, handle) == before
    lib.OgaDestroyConfig(handle)


POSITIONED = [
    ([{"kind": "fixed", "layer_ids": [0]}], FIXED_KIND),
    ([{"kind": "bogus", "layer_ids": [0]}], "model:decoder:state_groups:kind:Unsupported decoder state group kind 'bogus'"),
    ([{"kind": "paged_kv", "layer_ids": [0], "past_key_names": "a.%d"}],
     'model:decoder:state_groups: Unknown value "past_key_names"'),
    ([{"kind": "paged_kv", "layer_ids": [0], "foo": 1}], 'model:decoder:state_groups: Unknown value "foo"'),
    ([{"kind": "fixed_conv", "layer_ids": [0], "bindings": {"input": "a.%d"}}], LEGACY_BINDINGS),
]


@pytest.mark.parametrize("groups,what", POSITIONED)
def test_state_group_key_errors_are_positioned(lib, tmp_path, groups, what):
    path = write_config(tmp_path, with_groups(groups))
    _, msg = create_config(lib, tmp_path)
    assert re.fullmatch(re.escape(f"Error encountered while parsing '{path}' JSON Error: {what}") +
                        r" at line 1 index \d+", msg), msg


def test_valid_manifests_and_decoder_keys_are_accepted(lib, tmp_path):
    cfg = with_groups([{"kind": "paged_kv", "layer_ids": [3]}, {"kind": "fixed_conv", "layer_ids": [0, 1, 2]},
                       {"kind": "fixed_recurrent", "layer_ids": [0, 1, 2]}])
    dec = cfg["model"]["decoder"]
    dec["sliding_window"] = {"window_size": 8, "layers": [3], "slide_key_value_cache": False, "alignment": "left"}
    dec["session_options"] = {"log_id": "x", "enable_profiling": "p", "custom_ops_library": "lib.so",
                              "provider_options": [{"cuda": {"enable_cuda_graph": "1"}}], "whatever": {"a": [1]}}
    dec["pipeline"] = []
    dec["inputs"]["attention_mask"] = "attention_mask"
    handle, msg = create_config(lib, write_config(tmp_path, cfg))
    assert msg is None, msg
    assert json.loads(config_json(lib, handle)) == cfg
    lib.OgaDestroyConfig(handle)


# ---------------------------------------------------------------------------------------------
# Model loading
# ---------------------------------------------------------------------------------------------
def test_create_model_without_a_loader(lib, tmp_path, no_loader):
    write_config(tmp_path, base_config())
    _, msg = load_model(lib, tmp_path)
    assert msg == NO_LOADER
    handle, _ = create_config(lib, tmp_path)
    model = P()
    assert error(lib, lib.OgaCreateModelFromConfig(handle, byref(model))) == NO_LOADER
    assert not model.value
    lib.OgaDestroyConfig(handle)
    # Configuration errors come first.
    write_config(tmp_path, '{"model": ')
    _, msg = load_model(lib, tmp_path)
    assert msg.startswith("Error encountered while parsing ")


def test_loader_receives_resolved_names_and_the_model_runs(lib, tmp_path, loader):
    fake = loader()
    cfg = with_groups([{"kind": "paged_kv", "layer_ids": [1, 3]}])
    cfg["model"]["decoder"]["filename"] = "decoder.onnx"
    cfg["model"]["decoder"]["inputs"]["logits_indices"] = "logits_indices"
    cfg["model"]["decoder"]["inputs"]["block_table"] = "bt"
    write_config(tmp_path, cfg)
    handle, _ = create_config(lib, tmp_path)
    ok(lib, lib.OgaConfigOverlay(handle, b'{"engine": {"dynamic_batching": {"max_batch_size": 3}}}'))
    ok(lib, lib.OgaConfigAppendProvider(handle, b"cpu"))
    model = P()
    ok(lib, lib.OgaCreateModelFromConfig(handle, byref(model)))
    assert fake.error is None, fake.error
    (names,) = fake.calls
    assert names["config_json"] == config_json(lib, handle)
    lib.OgaDestroyConfig(handle)  # the model does not need the config any more
    assert json.loads(names["config_json"])["engine"]["dynamic_batching"]["max_batch_size"] == 3
    assert names["model_directory"] == str(tmp_path)
    assert names["decoder_filename"] == "decoder.onnx"
    assert names["input_ids"] == "input_ids" and names["block_table"] == "bt"
    assert names["position_ids"] == "position_ids" and names["block_table_windowed"] == "block_table_windowed"
    assert names["logits_indices"] == "logits_indices" and names["logits"] == "logits"
    assert names["paged_layer_ids"] == [1, 3]
    assert names["past_key_names"] == ["past_key_values.1.key", "past_key_values.3.key"]
    assert names["present_value_names"] == ["present.1.value", "present.3.value"]
    assert names["block_size"] == 4 and names["vocab_size"] == 64

    h = Handles(lib, model)
    lib.OgaDestroyModel(model)
    buf = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 16, byref(buf)))
    assert fake.executor.opened[0]["max_batch_size"] == 3
    req = h.request()
    h.begin(req, [5, 9, 13], max_gen=4)
    events = h.drain(buf)
    assert fake.executor.error is None
    assert sum(1 for _, ev in events if ev[2] is not None) == 4
    lib.OgaDestroyRequest(req)
    lib.OgaDestroyEngineEventBuffer(buf)
    h.destroy()
    assert fake.executor.released == 1


def test_loader_receives_fixed_states_window_layers_and_sizes(lib, tmp_path, loader):
    """The state groups, sliding-window layers, sizes and session options resolved in the core, so
    that no executor parses genai_config.json again."""
    fake = loader()
    cfg = with_groups([{"kind": "fixed_conv", "layer_ids": [2, 0]}, {"kind": "paged_kv", "layer_ids": [1, 3]},
                       {"kind": "fixed_recurrent", "layer_ids": [4]}])
    decoder = cfg["model"]["decoder"]
    decoder["num_hidden_layers"] = 5
    decoder["inputs"]["past_recurrent_names"] = "rec.%d.in"
    decoder.update(num_key_value_heads=2, head_size=16,
                   session_options={"log_id": "x", "intra_op_num_threads": 1})
    decoder["sliding_window"] = {"window_size": 8, "layers": [3]}
    cfg["engine"]["dynamic_batching"]["num_blocks"] = 40
    cfg["search"] = {"chunk_size": 4}
    write_config(tmp_path, cfg)
    model, msg = load_model(lib, tmp_path)
    assert msg is None, msg
    (names,) = fake.calls
    assert names["fixed_states"] == [
        (1, 2, "past_key_values.2.conv_state", "present.2.conv_state"),
        (1, 0, "past_key_values.0.conv_state", "present.0.conv_state"),
        (2, 4, "rec.4.in", "present.4.recurrent_state")]
    assert names["sliding_window_layers"] == [3]
    assert [names[f] for f in SIZE_FIELDS] == [2, 16, 5, 40]
    assert names["session_options"] == {"log_id": "x", "intra_op_num_threads": 1}
    lib.OgaDestroyModel(model)
    # without them: empty lists, zero sizes, "{}"
    fake = loader()
    bare = base_config()
    for key in ("num_key_value_heads", "head_size", "session_options"):
        del bare["model"]["decoder"][key]
    del bare["engine"]["dynamic_batching"]["num_blocks"]
    write_config(tmp_path, bare)
    model, msg = load_model(lib, tmp_path)
    assert msg is None, msg
    (names,) = fake.calls
    assert names["fixed_states"] == [] and names["sliding_window_layers"] == []
    assert names["num_key_value_heads"] == names["head_size"] == names["num_blocks"] == 0
    assert names["num_hidden_layers"] == 4 and names["session_options"] == {}
    lib.OgaDestroyModel(model)


def test_the_config_answers_what_the_loader_would_receive(tmp_path):
    """OgaExtConfigGetDecoderNames (oga.testing.decoder_names) is the loader's view, updated by edits."""
    import oga as og
    from oga import testing

    cfg = with_groups([{"kind": "paged_kv", "layer_ids": [1, 3]}])
    write_config(tmp_path, cfg)
    config = og.Config(str(tmp_path))
    names = testing.decoder_names(config)
    assert names["past_key_names"] == ["past_key_values.1.key", "past_key_values.3.key"]
    assert names["num_blocks"] == 64
    config.overlay('{"engine": {"dynamic_batching": {"num_blocks": 33}}}')
    assert testing.decoder_names(config)["num_blocks"] == 33
    broken = with_groups([{"kind": "fixed_conv", "layer_ids": [0]}])
    write_config(tmp_path, broken)
    with pytest.raises(RuntimeError, match="Dynamic batching requires exactly one paged_kv decoder state group"):
        testing.decoder_names(str(tmp_path))


def test_legacy_manifest_is_dense_and_not_inserted(lib, tmp_path, loader):
    fake = loader()
    write_config(tmp_path, base_config())
    model, msg = load_model(lib, tmp_path / "genai_config.json")
    assert msg is None, msg
    (names,) = fake.calls
    assert names["paged_layer_ids"] == [0, 1, 2, 3]
    assert names["past_value_names"] == [f"past_key_values.{i}.value" for i in range(4)]
    assert names["present_key_names"] == [f"present.{i}.key" for i in range(4)]
    assert names["logits_indices"] == ""
    assert "state_groups" not in json.loads(names["config_json"])["model"]["decoder"]
    lib.OgaDestroyModel(model)


def test_decoder_defaults(lib, tmp_path, loader):
    fake = loader()
    cfg = base_config()
    dec = cfg["model"]["decoder"]
    del dec["filename"], dec["inputs"], dec["outputs"]
    write_config(tmp_path, cfg)
    model, msg = load_model(lib, tmp_path)
    assert msg is None, msg
    (names,) = fake.calls
    assert {k: names[k] for k in NAME_FIELDS[2:]} == {
        "decoder_filename": "model.onnx", "input_ids": "input_ids", "position_ids": "position_ids",
        "cumulative_sequence_lengths": "cumulative_sequence_lengths", "past_sequence_lengths": "past_sequence_lengths",
        "block_table": "block_table", "block_table_windowed": "block_table_windowed",
        "attention_metadata": "attention_metadata", "attention_mask": "attention_mask", "logits_indices": "", "logits": "logits"}
    assert names["past_key_names"][2] == "past_key_values.2.key" and names["present_value_names"][0] == "present.0.value"
    lib.OgaDestroyModel(model)


def no_layers_config():
    cfg = base_config()
    del cfg["model"]["decoder"]["num_hidden_layers"]
    return cfg


def legacy_template_config():
    cfg = base_config()
    cfg["model"]["decoder"]["outputs"]["present_key_names"] = "present.key"
    return cfg


def sliding_config(layers):
    cfg = with_groups([{"kind": "paged_kv", "layer_ids": [0, 1]}])
    cfg["model"]["decoder"]["sliding_window"] = {"window_size": 8, "layers": layers}
    return cfg


def static_fixed_config():
    cfg = with_groups([{"kind": "paged_kv", "layer_ids": [3]}, {"kind": "fixed_conv", "layer_ids": [0]}])
    cfg["engine"] = {"static_batching": {"max_batch_size": 2}}
    return cfg


LOAD_ERRORS = [
    (with_groups([{"kind": "paged_kv", "layer_ids": [0, 1]}, {"kind": "paged_kv", "layer_ids": [2]}]),
     "Dynamic batching requires exactly one paged_kv decoder state group"),
    (with_groups([{"kind": "fixed_conv", "layer_ids": [0]}]),
     "Dynamic batching requires exactly one paged_kv decoder state group"),
    (no_layers_config(), "Dynamic batching requires at least one paged_kv decoder layer"),
    (legacy_template_config(),
     "model.decoder.outputs.present_key_names template 'present.key' must contain exactly one %d"),
    (sliding_config([4]), "Sliding-window layer index is outside the decoder layer range."),
    (sliding_config([2]), "Every sliding-window layer must belong to the paged_kv decoder state group."),
]


def test_fixed_groups_without_dynamic_batching_load_but_the_engine_refuses_them(lib, tmp_path, loader):
    """As onnxruntime-genai 0.18: og.Model succeeds, og.Engine raises."""
    fake = loader()
    write_config(tmp_path, static_fixed_config())
    model, msg = load_model(lib, tmp_path)
    assert msg is None and len(fake.calls) == 1
    engine = P()
    assert error(lib, lib.OgaCreateEngine(model, byref(engine))) == \
        "Fixed decoder state groups require engine.dynamic_batching"
    assert engine.value is None
    lib.OgaDestroyModel(model)


@pytest.mark.parametrize("cfg,expected", LOAD_ERRORS)
def test_model_creation_checks_the_decoder_state(lib, tmp_path, loader, cfg, expected):
    fake = loader()
    write_config(tmp_path, cfg)
    _, msg = load_model(lib, tmp_path)
    assert msg == expected
    assert fake.calls == []


def test_loader_failure_message_and_release(lib, tmp_path, loader):
    write_config(tmp_path, base_config())
    fake = loader(fail="Cannot open decoder.onnx: no such file")
    _, msg = load_model(lib, tmp_path)
    assert msg == "Cannot open decoder.onnx: no such file"
    assert fake.executor.released == 0
    fake = loader(fail="", release_on_fail=True)
    _, msg = load_model(lib, tmp_path)
    assert msg == "The model loader failed without a message."
    assert fake.executor.released == 1


def test_python_model_constructor_uses_the_loader(lib, tmp_path, loader):
    fake = loader()
    write_config(tmp_path, base_config())
    model = og.Model(str(tmp_path))
    assert len(fake.calls) == 1
    engine = og.Engine(model)
    del engine, model


def test_python_model_constructor_without_a_loader(tmp_path, no_loader):
    write_config(tmp_path, base_config())
    with pytest.raises(RuntimeError, match="^No model loader is registered"):
        og.Model(str(tmp_path))


@pytest.mark.skipif(not hasattr(og, "Config"), reason="oga.Config not exposed by this build")
def test_python_config_surface(tmp_path, loader):
    fake = loader()
    write_config(tmp_path, base_config())
    config = og.Config(str(tmp_path))
    with pytest.raises(RuntimeError) as info:
        config.overlay('{"engine": {"dynamic_batching": {"max_scheduled_tokens": 0}}}')
    assert str(info.value) == "JSON Error: max_scheduled_tokens must be > 0 at line 1 index 58"
    config.overlay('{"search": {"max_length": 32}}')
    config.clear_providers()
    config.append_provider("cpu")
    config.set_provider_option("cpu", "k", "v")
    og.Model(config)
    effective = json.loads(fake.calls[0]["config_json"])
    assert effective["search"]["max_length"] == 32
    assert effective["model"]["decoder"]["session_options"]["provider_options"] == [{"cpu": {"k": "v"}}]


# ---------------------------------------------------------------------------------------------
# File names confined to the model directory (0.18's check and texts, at config creation)
# ---------------------------------------------------------------------------------------------
TRAVERSAL = "Config path must not contain path traversal (..): "
NOT_RELATIVE = "Config path must be a relative path under the model directory, got: "

# filename -> the text after "model.decoder.filename: ", as onnxruntime-genai 0.18 reports them
ESCAPING_DECODER_FILENAMES = [
    ("../x/decoder.onnx", TRAVERSAL), ("sub/../model.onnx", TRAVERSAL), ("sub/..", TRAVERSAL),
    ("..", TRAVERSAL), ("../", TRAVERSAL), ("./..", TRAVERSAL), ("..\\x\\decoder.onnx", TRAVERSAL),
    ("sub\\..\\model.onnx", TRAVERSAL), ("/models/x/decoder.onnx", NOT_RELATIVE), ("/../x", NOT_RELATIVE),
    ("//server/x/decoder.onnx", NOT_RELATIVE), ("\\x\\decoder.onnx", NOT_RELATIVE),
    ("\\\\server\\share\\m.onnx", NOT_RELATIVE),
]
ACCEPTED_DECODER_FILENAMES = ["model.onnx", "./model.onnx", "sub/model.onnx", "..model.onnx", "a..b/model.onnx",
                              " ../model.onnx", "C:/model.onnx", ""]
# The other file names 0.18 checks (oga loads none of them), in the order 0.18 checks them; the
# decoder's come last.
OTHER_CONFIG_PATHS = [("encoder", "filename"), ("embedding", "filename"), ("vision", "filename"),
                      ("vision", "config_filename"), ("vision", "adapter_filename"), ("vision", "pipeline"),
                      ("speech", "filename"), ("speech", "config_filename"), ("speech", "adapter_filename"),
                      ("joiner", "filename"), ("vad", "filename"), ("moonshine", "frontend_filename"),
                      ("moonshine", "encoder_filename"), ("moonshine", "adapter_filename"),
                      ("moonshine", "cross_kv_filename"), ("moonshine", "decoder_kv_filename"),
                      ("decoder", "filename"), ("decoder", "pipeline")]


def with_decoder_filename(filename):
    cfg = base_config()
    cfg["model"]["decoder"]["filename"] = filename
    return cfg


def with_model_path(section, key, path):
    """base_config with model.<section>.<key> = path (a pipeline key: one stage whose filename it is)."""
    cfg = base_config()
    value = [{"stage": {"filename": path, "inputs": ["x"]}}] if key == "pipeline" else path
    cfg["model"].setdefault(section, {})[key] = value
    return cfg


def path_error(section, key, path, text):
    return f"model.{section}.{key if key != 'pipeline' else 'pipeline.filename'}: {text}{path}"


@pytest.mark.parametrize("filename,text", ESCAPING_DECODER_FILENAMES)
def test_decoder_filenames_that_escape_the_directory_are_refused(lib, tmp_path, loader, filename, text):
    """OgaCreateConfig and OgaCreateModel refuse them before anything is loaded, as og.Config and
    og.Model do; so does an overlay (0.18 does not check overlays: README)."""
    fake = loader()
    write_config(tmp_path, with_decoder_filename(filename))
    expected = f"model.decoder.filename: {text}{filename}"
    assert create_config(lib, tmp_path) == (None, expected)
    assert load_model(lib, tmp_path) == (None, expected)
    for create in (og.Config, og.Model):
        with pytest.raises(RuntimeError) as info:
            create(str(tmp_path))
        assert str(info.value) == expected
    handle, msg = create_config(lib, write_config(tmp_path / "ok", base_config()))
    before = config_json(lib, handle)
    overlay = json.dumps({"model": {"decoder": {"filename": filename}}}).encode()
    assert error(lib, lib.OgaConfigOverlay(handle, overlay)) == expected
    assert config_json(lib, handle) == before
    lib.OgaDestroyConfig(handle)
    assert fake.calls == []


@pytest.mark.parametrize("filename", ACCEPTED_DECODER_FILENAMES)
def test_decoder_filenames_inside_the_directory_are_accepted(lib, tmp_path, loader, filename):
    fake = loader()
    write_config(tmp_path, with_decoder_filename(filename))
    model, msg = load_model(lib, tmp_path)
    assert msg is None, msg
    assert fake.calls[0]["decoder_filename"] == filename
    lib.OgaDestroyModel(model)


@pytest.mark.parametrize("section,key", OTHER_CONFIG_PATHS)
def test_every_config_path_0_18_checks_is_checked(lib, tmp_path, loader, section, key):
    fake = loader()
    for path, text in (("../evil.onnx", TRAVERSAL), ("/evil.onnx", NOT_RELATIVE)):
        write_config(tmp_path, with_model_path(section, key, path))
        assert load_model(lib, tmp_path) == (None, path_error(section, key, path, text))
    write_config(tmp_path, with_model_path(section, key, "inside/file.onnx"))
    model, msg = load_model(lib, tmp_path)
    assert msg is None, msg
    lib.OgaDestroyModel(model)
    assert len(fake.calls) == 1


def test_config_paths_are_checked_in_0_18s_order(lib, tmp_path):
    cfg = base_config()
    for section, key in OTHER_CONFIG_PATHS:
        cfg = json.loads(json.dumps(cfg))
        value = f"../{section}.{key}"
        cfg["model"].setdefault(section, {})[key] = [{"s": {"filename": value}}] if key == "pipeline" else value
    for section, key in OTHER_CONFIG_PATHS:
        _, msg = create_config(lib, write_config(tmp_path, cfg))
        assert msg == path_error(section, key, f"../{section}.{key}", TRAVERSAL)
        del cfg["model"][section][key]
    assert create_config(lib, write_config(tmp_path, cfg))[1] is None


def test_a_nul_in_a_filename_cannot_hide_a_traversal(lib, tmp_path, loader):
    """The loader reads the name up to its first NUL (a JSON \\u0000 escape; 0.18's parser refuses
    it): "x/..<NUL>" must not pass as "x/..". The message, a C string, ends at the NUL too."""
    fake = loader()
    for filename in ("x/..\u0000", "..\u0000a", "ok\u0000/../../x"):
        write_config(tmp_path, with_decoder_filename(filename))
        shown = filename.split("\0")[0]
        assert load_model(lib, tmp_path) == (None, f"model.decoder.filename: {TRAVERSAL}{shown}")
    assert fake.calls == []


def test_symlinks_inside_the_directory_are_followed(lib, tmp_path, loader):
    """As 0.18 (observed): the check is lexical; a symlink in the model directory, to a file or a
    directory anywhere, loads (model directories assembled from links, such as Hugging Face cache
    snapshots, keep working)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "decoder.onnx").write_bytes(b"")
    directory = tmp_path / "model"
    directory.mkdir()
    os.symlink(outside / "decoder.onnx", directory / "link.onnx")
    os.symlink(outside, directory / "linked")
    fake = loader()
    for filename in ("link.onnx", "linked/decoder.onnx"):
        write_config(directory, with_decoder_filename(filename))
        model, msg = load_model(lib, directory)
        assert msg is None, msg
        lib.OgaDestroyModel(model)
    assert [c["decoder_filename"] for c in fake.calls] == ["link.onnx", "linked/decoder.onnx"]


# ---------------------------------------------------------------------------------------------
# Automatic block-pool sizing
# ---------------------------------------------------------------------------------------------
def auto_engine(lib, tmp_path, loader, bytes_per_block, **dyn):
    fake = loader(bytes_per_block=bytes_per_block)
    cfg = base_config()
    batching = {"block_size": 4, "max_batch_size": 4, "gpu_utilization_factor": 0.5}
    batching.update(dyn)
    cfg["engine"]["dynamic_batching"] = {k: v for k, v in batching.items() if v is not None}
    write_config(tmp_path, cfg)
    model, msg = load_model(lib, tmp_path)
    assert msg is None, msg
    engine = P()
    msg = error(lib, lib.OgaCreateEngine(model, byref(engine)))
    lib.OgaDestroyModel(model)
    if msg is not None:
        return None, msg
    blocks = fake.executor.opened[0]["num_blocks"]
    lib.OgaDestroyEngine(engine)
    return blocks, None


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no MemAvailable")


def test_auto_sizing_is_capped_by_what_requests_can_use(lib, tmp_path, loader):
    # context 128 / block 4 = 32 blocks per request, 4 requests.
    assert auto_engine(lib, tmp_path, loader, 1) == (4 * 32, None)
    assert auto_engine(lib, tmp_path, loader, 1, block_size=5) == (4 * 26, None)


def test_auto_sizing_follows_available_memory(lib, tmp_path, loader):
    target = 50
    per_block = int(mem_available() * 0.9 * 0.5 / target)
    blocks, msg = auto_engine(lib, tmp_path, loader, per_block)
    assert msg is None, msg
    # a block is ~1% of the budget, so what MemAvailable drifts by between the two reads moves the
    # count by a block or two at most; without the 0.9 headroom it would be 55
    assert 0.96 * target <= blocks <= 1.04 * target
    blocks, msg = auto_engine(lib, tmp_path, loader, per_block // 2, gpu_utilization_factor=0.25)
    assert msg is None and 0.96 * target <= blocks <= 1.04 * target


def test_auto_sizing_follows_the_devices_free_memory(lib, tmp_path, loader):
    """An executor whose OgaExtDeviceOps reports its memory sizes the cache from the device's free
    bytes, not the host's."""
    free = 10 * 2 ** 30
    per_block = 2 ** 20
    expected = int(free * 0.9 * 0.5 // per_block)  # 4608 fit; 8 requests x 32 blocks can use 256
    blocks, msg = auto_engine(lib, tmp_path, lambda **kw: loader(device_memory=(free, 2 * free), **kw), per_block,
                              max_batch_size=8)
    assert msg is None, msg
    assert blocks == min(expected, 8 * 32)
    blocks, msg = auto_engine(lib, tmp_path, lambda **kw: loader(device_memory=(free, 2 * free), **kw),
                              free // 100, max_batch_size=64)
    assert msg is None and blocks == int(free * 0.9 * 0.5 // (free // 100))  # 45 < 64 x 32
    blocks, msg = auto_engine(lib, tmp_path, lambda **kw: loader(device_memory="cudaMemGetInfo: no device", **kw),
                              per_block)
    assert blocks is None and msg == (
        "Cannot size the KV cache from engine.dynamic_batching.gpu_utilization_factor: the device's free memory is "
        "unknown (cudaMemGetInfo: no device). Set engine.dynamic_batching.num_blocks.")


def test_auto_sizing_errors(lib, tmp_path, loader):
    assert auto_engine(lib, tmp_path, loader, 2 ** 62) == (None, BUDGET)
    assert auto_engine(lib, tmp_path, loader, 1, gpu_utilization_factor=None) == (None, BUDGET)
    assert auto_engine(lib, tmp_path, loader, 0) == (None, (
        "Automatic KV-cache sizing from engine.dynamic_batching.gpu_utilization_factor is not supported yet by oga; "
        "set engine.dynamic_batching.num_blocks."))
    # An explicit num_blocks wins over the factor.
    assert auto_engine(lib, tmp_path, loader, 2 ** 62, num_blocks=7) == (7, None)


# ---------------------------------------------------------------------------------------------
# Conformance with onnxruntime_genai 0.18 (config-time texts)
# ---------------------------------------------------------------------------------------------
PROBE = r"""
import json, sys
import onnxruntime_genai as og
out = []
for directory, overlay in json.load(sys.stdin):
    try:
        config = og.Config(directory)
        if overlay is not None:
            config.overlay(overlay)
        out.append(None)
    except Exception as exc:
        out.append(str(exc))
print(json.dumps(out))
"""


def test_config_path_errors_match_onnxruntime_genai(lib, tmp_path):
    """Every escaping and accepted form, the other file names 0.18 checks, and a config with two bad
    names (which one is reported), run through onnxruntime_genai 0.18's og.Config on the same
    directories."""
    import onnxruntime_genai  # noqa: F401  (a test dependency: missing, it fails)
    cases = [with_decoder_filename(f) for f, _ in ESCAPING_DECODER_FILENAMES]
    cases += [with_decoder_filename(f) for f in ACCEPTED_DECODER_FILENAMES]
    cases += [with_model_path(s, k, "../evil.onnx") for s, k in OTHER_CONFIG_PATHS]
    cases += [with_model_path(s, k, "/evil.onnx") for s, k in OTHER_CONFIG_PATHS]
    two = with_decoder_filename("../decoder.onnx")
    two["model"]["embedding"] = {"filename": "/embedding.onnx"}
    cases.append(two)
    jobs, ours = [], []
    for i, cfg in enumerate(cases):
        directory = tmp_path / f"p{i}"
        write_config(directory, cfg)
        jobs.append((str(directory), None))
        handle, msg = create_config(lib, directory)
        if handle is not None:
            lib.OgaDestroyConfig(handle)
        ours.append(msg)
    theirs = json.loads(subprocess.run([sys.executable, "-c", PROBE], input=json.dumps(jobs), capture_output=True,
                                       text=True, check=True, timeout=120).stdout)
    assert ours == theirs
    assert sum(m is not None for m in theirs) == len(cases) - len(ACCEPTED_DECODER_FILENAMES)


def test_config_errors_match_onnxruntime_genai(lib, tmp_path):
    import onnxruntime_genai  # noqa: F401  (a test dependency: missing, it fails)
    jobs, ours = [], []
    cases = ALL_STATE_GROUP_CASES + [(with_groups(g), None) for g, _ in POSITIONED]
    for i, (cfg, _) in enumerate(cases):
        directory = tmp_path / f"c{i}"
        write_config(directory, cfg)
        jobs.append((str(directory), None))
        ours.append(create_config(lib, directory))
    write_config(tmp_path / "base", base_config())
    for overlay, _ in OVERLAY_ERRORS[:6]:
        jobs.append((str(tmp_path / "base"), overlay))
        handle, _ = create_config(lib, tmp_path / "base")
        ours.append((None, error(lib, lib.OgaConfigOverlay(handle, overlay.encode()))))
        lib.OgaDestroyConfig(handle)
    theirs = json.loads(subprocess.run([sys.executable, "-c", PROBE], input=json.dumps(jobs), capture_output=True,
                                       text=True, check=True, timeout=120).stdout)
    for job, (handle, msg), expected in zip(jobs, ours, theirs):
        if handle is not None:
            lib.OgaDestroyConfig(handle)
        assert msg == expected, job

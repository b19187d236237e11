"""The Generator through the C API (ctypes), side by side with onnxruntime-genai 0.18's library on
OGA's own CPU build of the tiny Llama: the same calls with 0.18's signatures give the same
sequences, next tokens, logits tensors and error texts; oga's functions also accept NULL."""

import ctypes
import os
from ctypes import POINTER, byref, c_bool, c_double, c_float, c_int32, c_int64, c_size_t, c_void_p

import numpy as np
import pytest

import oga as og  # noqa: F401  (registers the model loader OgaCreateModel uses)
from capi import SIGNATURES, P, load
from static_models import tiny_llama_static_dir  # noqa: F401

ref = pytest.importorskip("onnxruntime_genai")

FLOAT32 = 1


def ref_library():
    lib = ctypes.CDLL(os.path.join(os.path.dirname(ref.__file__), "libonnxruntime-genai.so"))
    for name, (restype, argtypes) in SIGNATURES.items():
        if name.startswith("OgaExt") or not hasattr(lib, name):
            continue
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


LIBRARIES = {"0.18": ref_library, "oga": load}


class Api:
    def __init__(self, lib):
        self.lib = lib

    def check(self, result):
        if result:
            message = self.lib.OgaResultGetError(result).decode()
            self.lib.OgaDestroyResult(result)
            raise RuntimeError(message)

    def error(self, result):
        try:
            self.check(result)
        except RuntimeError as e:
            return str(e)
        return None

    def generator(self, directory, **numbers):
        model, params, generator = P(), P(), P()
        self.check(self.lib.OgaCreateModel(directory.encode(), byref(model)))
        self.check(self.lib.OgaCreateGeneratorParams(model, byref(params)))
        for name, value in numbers.items():
            self.check(self.lib.OgaGeneratorParamsSetSearchNumber(params, name.encode(), c_double(value)))
        self.check(self.lib.OgaCreateGenerator(model, params, byref(generator)))
        self.lib.OgaDestroyGeneratorParams(params)
        self.lib.OgaDestroyModel(model)
        return generator

    def append(self, generator, tokens):
        array = (c_int32 * len(tokens))(*tokens)
        return self.error(self.lib.OgaGenerator_AppendTokens(generator, array, len(tokens)))

    def sequence(self, generator, index):
        count = self.lib.OgaGenerator_GetSequenceCount(generator, index)
        data = self.lib.OgaGenerator_GetSequenceData(generator, index)
        return [data[i] for i in range(count)]

    def next_tokens(self, generator):
        data, count = POINTER(c_int32)(), c_size_t()
        self.check(self.lib.OgaGenerator_GetNextTokens(generator, byref(data), byref(count)))
        return [data[i] for i in range(count.value)]

    def logits(self, generator):
        tensor = P()
        self.check(self.lib.OgaGenerator_GetLogits(generator, byref(tensor)))
        rank, kind, data = c_size_t(), c_int32(), c_void_p()
        self.check(self.lib.OgaTensorGetShapeRank(tensor, byref(rank)))
        shape = (c_int64 * rank.value)()
        self.check(self.lib.OgaTensorGetShape(tensor, shape, rank.value))
        self.check(self.lib.OgaTensorGetType(tensor, byref(kind)))
        self.check(self.lib.OgaTensorGetData(tensor, byref(data)))
        count = int(np.prod(list(shape)))
        values = np.ctypeslib.as_array((c_float * count).from_address(data.value)).copy()
        self.lib.OgaDestroyTensor(tensor)
        return list(shape), kind.value, values

    def set_logits(self, generator, values):
        values = np.ascontiguousarray(values, np.float32)
        shape = (c_int64 * values.ndim)(*values.shape)
        tensor = P()
        self.check(self.lib.OgaCreateTensorFromBuffer(values.ctypes.data, shape, values.ndim, FLOAT32, byref(tensor)))
        result = self.error(self.lib.OgaGenerator_SetLogits(generator, tensor))
        self.lib.OgaDestroyTensor(tensor)
        return result


def scenario(api, directory):
    lib = api.lib
    record = []
    g = api.generator(directory, max_length=24)
    record.append(("empty", lib.OgaGenerator_TokenCount(g), lib.OgaGenerator_IsDone(g), api.next_tokens(g)))
    record.append(("generate first", api.error(lib.OgaGenerator_GenerateNextToken(g))))
    record.append(("append", api.append(g, [1, 504, 3575, 282])))
    shape, kind, values = api.logits(g)
    record.append(("logits", shape, kind, int(np.argmax(values))))
    for _ in range(4):
        api.check(lib.OgaGenerator_GenerateNextToken(g))
    record.append(("after 4", api.sequence(g, 0), api.next_tokens(g), lib.OgaGenerator_TokenCount(g)))
    forced = np.full((1, 1, values.size), -9.0, np.float32)
    forced[0, 0, 1234] = 9.0
    record.append(("set logits before computing", api.set_logits(g, forced)))
    api.logits(g)
    record.append(("set logits", api.set_logits(g, forced)))
    record.append(("set logits wrong size", api.set_logits(g, forced[:, :, :10])))
    api.check(lib.OgaGenerator_GenerateNextToken(g))
    record.append(("forced", api.sequence(g, 0)[-1]))
    record.append(("rewind too far", api.error(lib.OgaGenerator_RewindTo(g, 100))))
    api.check(lib.OgaGenerator_RewindTo(g, 6))
    record.append(("rewound", api.sequence(g, 0), api.next_tokens(g)))
    api.check(lib.OgaGenerator_GenerateNextToken(g))
    record.append(("after rewind", api.sequence(g, 0)))
    record.append(("terminate bad", api.error(lib.OgaGenerator_SetRuntimeOption(g, b"terminate_session", b"x"))))
    api.check(lib.OgaGenerator_SetRuntimeOption(g, b"terminate_session", b"1"))
    record.append(("terminated", lib.OgaGenerator_IsSessionTerminated(g),
                   api.error(lib.OgaGenerator_GenerateNextToken(g))))
    api.check(lib.OgaGenerator_SetRuntimeOption(g, b"terminate_session", b"0"))
    while not lib.OgaGenerator_IsDone(g):
        api.check(lib.OgaGenerator_GenerateNextToken(g))
    record.append(("done", api.sequence(g, 0), lib.OgaGenerator_TokenCount(g),
                   api.error(lib.OgaGenerator_GenerateNextToken(g))))
    lib.OgaDestroyGenerator(g)

    batch = api.generator(directory, max_length=12, batch_size=2)
    sequences = P()
    api.check(lib.OgaCreateSequences(byref(sequences)))
    for row in ([1, 19556, 665, 11], [1, 81]):
        api.check(lib.OgaAppendTokenSequence((c_int32 * len(row))(*row), len(row), sequences))
    record.append(("ragged", api.error(lib.OgaGenerator_AppendTokenSequences(batch, sequences))))
    lib.OgaDestroySequences(sequences)
    for _ in range(3):
        api.check(lib.OgaGenerator_GenerateNextToken(batch))
    record.append(("ragged rows", api.sequence(batch, 0), api.sequence(batch, 1), api.next_tokens(batch)))
    record.append(("append twice", api.append(batch, [5, 6])))
    record.append(("rewind 1", api.error(lib.OgaGenerator_RewindTo(batch, 1))))
    lib.OgaDestroyGenerator(batch)
    return record


def test_the_c_api_matches_0_18(tiny_llama_static_dir):
    theirs = scenario(Api(ref_library()), tiny_llama_static_dir)
    ours = scenario(Api(load()), tiny_llama_static_dir)
    assert ours == theirs


def test_search_option_getters_match_0_18(tiny_llama_static_dir):
    out = []
    for make in (ref_library, load):
        api = Api(make())
        model, params = P(), P()
        api.check(api.lib.OgaCreateModel(tiny_llama_static_dir.encode(), byref(model)))
        api.check(api.lib.OgaCreateGeneratorParams(model, byref(params)))
        number, flag = c_double(), c_bool()
        record = [api.error(api.lib.OgaGeneratorParamsGetSearchNumber(params, b"max_length", byref(number))), number.value,
                  api.error(api.lib.OgaGeneratorParamsGetSearchBool(params, b"do_sample", byref(flag))), flag.value,
                  api.error(api.lib.OgaGeneratorParamsGetSearchNumber(params, b"do_sample", byref(number))),
                  api.error(api.lib.OgaGeneratorParamsGetSearchBool(params, b"top_k", byref(flag))),
                  api.error(api.lib.OgaGeneratorParamsSetSearchNumber(params, b"nope", 1.0)),
                  api.error(api.lib.OgaGeneratorParamsSetSearchNumber(params, b"random_seed", 2.0 ** 40))]
        api.lib.OgaDestroyGeneratorParams(params)
        api.lib.OgaDestroyModel(model)
        out.append(record)
    assert out[1] == out[0]


def test_oga_generator_functions_accept_null():
    lib = load()
    api = Api(lib)
    assert lib.OgaGenerator_IsDone(None) is False and lib.OgaGenerator_TokenCount(None) == 0
    assert lib.OgaGenerator_GetSequenceCount(None, 0) == 0 and not lib.OgaGenerator_GetSequenceData(None, 0)
    assert lib.OgaGenerator_IsSessionTerminated(None) is False
    assert api.error(lib.OgaGenerator_GenerateNextToken(None)) == "generator must not be null."
    assert api.error(lib.OgaGenerator_AppendTokens(None, None, 0)) == "generator must not be null."
    lib.OgaDestroyGenerator(None)
    lib.OgaDestroyTensor(None)

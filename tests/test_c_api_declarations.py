"""The C API is declared once, in include/oga/*.h; oga/_core.pxd, tests/capi.py SIGNATURES and the C
names the Cython layer and its stubs cite must agree with the headers (tests/c_api_declarations.py)."""
import ctypes

from c_api_declarations import (ctypes_type, header_constants, header_functions, header_structs, header_typedefs,
                                mismatches, pxd_declarations)
from capi import SIGNATURES


def test_secondary_declarations_match_the_headers():
    problems = mismatches()
    assert not problems, "declarations that disagree with include/oga/*.h:\n" + "\n".join(problems)


def test_the_pxd_declares_the_whole_c_api():
    functions, structs, constants = pxd_declarations()
    assert sorted(set(header_functions()) - set(functions)) == []
    assert sorted(set(header_structs()) - set(structs)) == []
    assert sorted(header_constants() - constants - {"OGA_EXT_LOGITS_BLOCK"}) == []


def test_the_abi_table_lists_the_whole_c_api():
    assert sorted(set(header_functions()) - set(SIGNATURES)) == []


def test_a_drifted_declaration_is_caught():
    # The parser reads what it should: a declaration whose type drifts no longer equals the header's.
    header = header_functions()
    good = "cdef extern from \"oga/oga.h\" nogil:\n    c_OgaResult* OgaTurnOptionsSetTopK(c_OgaTurnOptions* options, int32_t top_k)\n"
    functions, _, _ = pxd_declarations(good)
    assert functions["OgaTurnOptionsSetTopK"] == header["OgaTurnOptionsSetTopK"]
    drifted = good.replace("int32_t top_k", "int64_t top_k")
    functions, _, _ = pxd_declarations(drifted)
    assert functions["OgaTurnOptionsSetTopK"] != header["OgaTurnOptionsSetTopK"]
    continued = ("cdef extern from \"oga/oga.h\" nogil:\n"
                 "    c_OgaResult* OgaRequestBeginTurn(c_OgaRequest* request, const c_OgaTurnOptions* turn_options,\n"
                 "                                   const int32_t* input_ids, uint64_t input_ids_count, uint64_t* out_turn_id)\n")
    functions, _, _ = pxd_declarations(continued)
    assert functions["OgaRequestBeginTurn"] == header["OgaRequestBeginTurn"]


def test_ctypes_spellings():
    typedefs, structs = header_typedefs(), header_structs()
    assert ctypes_type("OgaResult*", typedefs, structs) is ctypes.c_void_p
    assert ctypes_type("OgaModel**", typedefs, structs) is ctypes.POINTER(ctypes.c_void_p)
    assert ctypes_type("const char* const*", typedefs, structs) is ctypes.POINTER(ctypes.c_char_p)
    assert ctypes_type("OgaFinishReason*", typedefs, structs) is ctypes.POINTER(ctypes.c_uint32)
    assert ctypes_type("OgaElementType", typedefs, structs) is ctypes.c_int32
    assert ctypes_type("const OgaExtStepInputs*", typedefs, structs) is ctypes.c_void_p
    assert ctypes_type("void", typedefs, structs) is None

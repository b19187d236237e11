# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
# cython: embedsignature=True
"""oga._core: extension types over the oga C API (include/oga/oga.h, include/oga/oga_ext.h).

Every public method converts its arguments, makes one C call and passes the returned OgaResult*
through check_result. Engine logic lives in the C++ core, never here.
"""

cimport cython
from cpython.buffer cimport PyBUF_READ, PyBUF_WRITE
from cpython.exc cimport PyErr_CheckSignals
from cpython.long cimport PyLong_AsLongLong, PyLong_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.stdint cimport INT32_MAX, INT32_MIN, int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy
from libcpp cimport bool as cbool

import enum
import functools
import json
import os
import signal
import threading

import numpy as np


include "_enums.pxi"
include "_errors.pxi"
include "_arguments.pxi"
include "_tokens.pxi"
include "_models.pxi"
include "_engine.pxi"
include "_generator.pxi"
include "_requests.pxi"
include "_events.pxi"
include "_testing.pxi"
include "_trampolines.pxi"
include "_device_ops.pxi"

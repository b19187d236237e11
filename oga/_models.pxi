# Part of oga/_core.pyx (included there; compiled as one module).

# ---------------------------------------------------------------------------------------------
# Models and generator params
# ---------------------------------------------------------------------------------------------

cdef object _model_directory(object config_path):
    """The directory of a model path, which may name genai_config.json itself."""
    path = os.fspath(config_path)
    return os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else os.path.abspath(path)


cdef class OgaConfig:
    """A model directory's configuration (OgaConfig*), to adjust before creating the model."""

    def __init__(self, config_path):
        """OgaCreateConfig."""
        cdef c_OgaConfig* config = NULL
        cdef c_OgaResult* result
        if self._ptr != NULL:
            raise RuntimeError("Config is already initialised.")
        encoded = os.fsencode(config_path)
        cdef const char* c_path = encoded
        with nogil:
            result = OgaCreateConfig(c_path, &config)
        check_result(result)
        self._ptr = config
        self.path = _model_directory(config_path)

    def __dealloc__(self):
        OgaDestroyConfig(self._ptr)
        self._ptr = NULL

    cdef int _alive(self) except -1:
        if self._ptr == NULL:
            _raise_dead("Config")
        return 0

    def overlay(self, str json not None):
        """OgaConfigOverlay: merges `json` into the configuration (validated before it is published)."""
        self._alive()
        check_result(OgaConfigOverlay(self._ptr, json.encode("utf-8")))

    def clear_providers(self):
        """OgaConfigClearProviders."""
        self._alive()
        check_result(OgaConfigClearProviders(self._ptr))

    def append_provider(self, str provider not None):
        """OgaConfigAppendProvider."""
        self._alive()
        check_result(OgaConfigAppendProvider(self._ptr, provider.encode("utf-8")))

    def set_provider_option(self, str provider not None, str key not None, str value not None):
        """OgaConfigSetProviderOption."""
        self._alive()
        check_result(OgaConfigSetProviderOption(self._ptr, provider.encode("utf-8"), key.encode("utf-8"),
                                                value.encode("utf-8")))


cdef class OgaModel:
    """A model: configuration plus executor (OgaModel*). `path` is its directory (None for models
    created without one, such as oga.testing test models)."""

    def __init__(self, config):
        """OgaCreateModel(path), or OgaCreateModelFromConfig(config) for a Config."""
        cdef c_OgaModel* model = NULL
        cdef c_OgaResult* result
        cdef const c_OgaConfig* c_config
        cdef const char* c_path
        if self._ptr != NULL:
            raise RuntimeError("Model is already initialised.")
        if isinstance(config, OgaConfig):
            c_config = (<OgaConfig>config)._ptr
            if c_config == NULL:
                _raise_dead("Config")
            with nogil:
                result = OgaCreateModelFromConfig(c_config, &model)
            if result == NULL:
                self._ptr = model  # released by __dealloc__ if an interruption is raised below
            _check_callbacks(result)
            self.path = (<OgaConfig>config).path
        else:
            encoded = os.fsencode(config)
            c_path = encoded
            with nogil:
                result = OgaCreateModel(c_path, &model)
            if result == NULL:
                self._ptr = model
            _check_callbacks(result)
            self.path = _model_directory(config)
        self._ptr = model

    def __dealloc__(self):
        OgaDestroyModel(self._ptr)
        self._ptr = NULL


cdef OgaModel _wrap_model(c_OgaModel* model):
    cdef OgaModel obj = OgaModel.__new__(OgaModel)
    obj._ptr = model
    return obj


cdef class OgaGeneratorParams:
    """Seed-era request defaults (OgaGeneratorParams*), used by Engine.create_request(params)."""

    def __init__(self, OgaModel model not None):
        """OgaCreateGeneratorParams."""
        cdef c_OgaGeneratorParams* params = NULL
        if self._ptr != NULL:
            raise RuntimeError("GeneratorParams is already initialised.")
        if model._ptr == NULL:
            _raise_dead("Model")
        check_result(OgaCreateGeneratorParams(model._ptr, &params))
        self._ptr = params

    def __dealloc__(self):
        OgaDestroyGeneratorParams(self._ptr)
        self._ptr = NULL

    def get_search_options(self):
        """Every search option (OgaGeneratorParamsGetSearchNumber / Bool) as a dict: numbers as
        float, bools as bool, keyed like onnxruntime-genai 0.18."""
        cdef double number
        cdef cbool flag
        if self._ptr == NULL:
            _raise_dead("GeneratorParams")
        out = {}
        for name, is_bool in _SEARCH_OPTIONS:
            c_name = (<str>name).encode()
            if is_bool:
                check_result(OgaGeneratorParamsGetSearchBool(self._ptr, c_name, &flag))
                out[name] = flag
            else:
                check_result(OgaGeneratorParamsGetSearchNumber(self._ptr, c_name, &number))
                out[name] = number
        return out

    def set_guidance(self, str type not None, str data not None, enable_ff_tokens=False):
        """OgaGeneratorParamsSetGuidance: json_schema, regex or lark_grammar guidance for the
        whole generation (enable_ff_tokens=True is not supported by oga)."""
        cdef bint c_ff = _boolean(enable_ff_tokens, "enable_ff_tokens")
        if self._ptr == NULL:
            _raise_dead("GeneratorParams")
        check_result(OgaGeneratorParamsSetGuidance(self._ptr, type.encode("utf-8"), data.encode("utf-8"),
                                                   c_ff))

    def set_speculative_options(self, **options):
        """OgaGeneratorParamsSetSpeculativeNumber: not supported by oga (raises)."""
        if self._ptr == NULL:
            _raise_dead("GeneratorParams")
        check_result(OgaGeneratorParamsSetSpeculativeNumber(self._ptr, b"", 0.0))

    def get_speculative_options(self):
        """OgaGeneratorParamsGetSpeculativeNumber: not supported by oga (raises)."""
        cdef double number
        if self._ptr == NULL:
            _raise_dead("GeneratorParams")
        check_result(OgaGeneratorParamsGetSpeculativeNumber(self._ptr, b"", &number))

    def set_search_options(self, **options):
        """OgaExtGeneratorParamsSetSearchOptions: bools as OgaGeneratorParamsSetSearchBool, numbers
        as OgaGeneratorParamsSetSearchNumber, all or none (a failure leaves the params as before)."""
        cdef size_t count = len(options)
        cdef const char** c_names
        cdef double[::1] numbers = np.empty(count, dtype=np.float64)
        cdef int32_t[::1] is_bool = np.empty(count, dtype=np.int32)
        cdef size_t i = 0
        cdef c_OgaResult* result
        if self._ptr == NULL:
            _raise_dead("GeneratorParams")
        if count == 0:
            return
        encoded = []
        for name, value in options.items():
            encoded.append(name.encode("utf-8"))
            if isinstance(value, (bool, np.bool_)):
                numbers[i] = 1.0 if value else 0.0
                is_bool[i] = 1
            elif isinstance(value, (str, bytes)):
                raise TypeError(f"Search option {name} must be a number or a bool, not {type(value).__name__}.")
            else:
                try:
                    numbers[i] = value
                except TypeError:
                    raise TypeError(
                        f"Search option {name} must be a number or a bool, not {type(value).__name__}.") from None
                is_bool[i] = 0
            i += 1
        c_names = <const char**>PyMem_Malloc(count * sizeof(const char*))
        if c_names == NULL:
            raise MemoryError()
        try:
            for i in range(count):
                c_names[i] = <const char*>(<bytes>encoded[i])
            result = OgaExtGeneratorParamsSetSearchOptions(self._ptr, count, c_names, &numbers[0], &is_bool[0])
        finally:
            PyMem_Free(c_names)
        check_result(result)


# 0.18's search option names (alphabetical, as get_search_options lists them) and whether each is a bool.
cdef tuple _SEARCH_OPTIONS = (
    ("batch_size", False), ("chunk_size", False), ("diversity_penalty", False), ("do_sample", True),
    ("early_stopping", True), ("length_penalty", False), ("max_length", False), ("min_length", False),
    ("no_repeat_ngram_size", False), ("num_beams", False), ("num_return_sequences", False),
    ("past_present_share_buffer", True), ("random_seed", False), ("repetition_penalty", False),
    ("temperature", False), ("top_k", False), ("top_p", False),
)

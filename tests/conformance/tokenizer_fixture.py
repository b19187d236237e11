"""A tokenizer for the conformance model (vocab 97), so stop strings and guidance run on 0.18.

0.18 loads the tokenizer of a stop-string or guided turn at `begin_turn` and needs `tokenizer.json`
AND `tokenizer_config.json` in the model directory (without the latter: "Failed to open a json file:
<dir>/tokenizer_config.json"); the random-weight conformance models have neither.

`write_tokenizer(directory)` writes a GPT-2 style byte-level BPE made with the `tokenizers` package:
ids 0-2 are the special tokens <unk>, <s>, </s> (BOS 1 and EOS 2 as genai_config.json says), and
every other id stands for the bytes in `TOKEN_TEXT`, or else for one character of `FILLER`. There
are no merges: the tokenizer is only ever used to decode the model's tokens (0.18 and oga decode a
byte-level token by mapping its characters back to bytes) and, for guidance, to tokenize the bytes
a grammar forces (see scenarios.py, guidance section).

The texts were chosen after running the model greedily (the token ids are the model's, fixed by
MODEL_SEED; the texts are ours), so that the greedy streams read as text with known token
boundaries:

    P_LONG [3, 7, 11] -> 16 63 24 90 49 90 49 96 90 49 96 88 41 39 22 ...
                         "Hello" " wor" "ld" " ab" "c" " ab" "c" "!" " ab" "c" "!" " x" "yz" "." " (" ...
    P_B [3, 61, 50]   -> 4 81 49 5 76 48 52 83 77 13 91 39 42 68 93 44 19 74 50 ...
                         "The" " cat" "c" b"\\xc3" b"\\xa9t" " sat" " on" " a" " no" " mat" "," "."
                         b"\\xe2" b"\\x82" b"\\xac" "5" "0" " then" " ran" ...
                         ("é" split over two tokens, "€" over three; those ids occur nowhere else in
                         the streams the scenarios use, so no lone continuation byte is ever decoded)
    P_EOS [8, 61, 50] -> 4 81 64 EOS: "The" " cat" " too"
"""
from __future__ import annotations

import json
import os

from model_dirs import byte_level_alphabet

# Token id -> the exact bytes it decodes to (in the middle of a text).
TOKEN_TEXT = {
    # P_LONG's greedy stream
    16: b"Hello", 63: b" wor", 24: b"ld", 90: b" ab", 49: b"c", 96: b"!", 88: b" x", 41: b"yz", 39: b".",
    22: b" (", 55: b"ok", 33: b")", 10: b"\n", 8: b" is", 57: b" it", 54: b" so", 95: b"?", 77: b" no",
    # P_B's greedy stream (5 76: "\u00e9t"; 42 68 93: "\u20ac")
    4: b"The", 81: b" cat", 5: b"\xc3", 76: b"\xa9t", 48: b" sat", 52: b" on", 83: b" a", 13: b" mat",
    91: b",", 42: b"\xe2", 68: b"\x82", 93: b"\xac", 44: b"5", 19: b"0", 74: b" then", 50: b" ran",
    15: b" up", 79: b" to", 66: b" me", 6: b" and", 64: b" too", 56: b" we", 25: b"nt", 53: b" la",
    # P_C's greedy stream
    86: b" said", 72: b" o", 3: b" yes",
}
# The remaining ids, in order: one character each (skipping characters TOKEN_TEXT already spells),
# so that a JSON object, digits and lower-case words can be spelled by some token sequence.
FILLER = "{}\":[]0123456789 abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
SPECIALS = ("<unk>", "<s>", "</s>")
VOCAB_SIZE = 97


# A variant whose P_LONG stream holds bytes that never form a character: " ab" becomes a lone
# continuation byte and "c" the first two bytes of a four-byte character, so P_LONG reads
# "Hello" " wor" "ld" b"\x80" b"\xf0\x9f" b"\x80" b"\xf0\x9f" "!" ..., which Python's "replace"
# handler decodes as "Hello world\ufffd\ufffd\ufffd!" (one U+FFFD per maximal invalid subpart:
# b"\x80", b"\xf0\x9f\x80", b"\xf0\x9f"). And one whose text ends with the first byte of a
# character: P_C reads "The" " cat" " said" " wor" b" o\xc3" b"\xa9k" ... (" o\u00e9k"); 72 and 55
# occur only there before the 19th token of P_LONG.
INVALID_UTF8 = {90: b"\x80", 49: b"\xf0\x9f", 72: b" o\xc3", 55: b"\xa9k"}


def token_bytes(overrides=None):
    """[bytes of token id] for every id (special tokens: b"")."""
    text = {**TOKEN_TEXT, **(overrides or {})}
    used = set(text.values())
    filler = (c.encode() for c in FILLER if c.encode() not in used)
    out = [b""] * len(SPECIALS)
    for i in range(len(SPECIALS), VOCAB_SIZE):
        out.append(text[i] if i in text else next(filler))
    return out


def write_tokenizer(directory, with_config=True, overrides=None, style="byte_level"):
    """tokenizer.json (and tokenizer_config.json unless with_config is False) into directory;
    `overrides` replaces some of TOKEN_TEXT. style "spm": see write_spm_tokenizer."""
    if style == "spm":
        return write_spm_tokenizer(directory)
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    b2u = byte_level_alphabet()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for i, piece in enumerate(token_bytes(overrides)):
        if i >= len(SPECIALS):
            text = "".join(b2u[b] for b in piece)
            assert text not in vocab, (i, piece)
            vocab[text] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE
    tok.save(os.path.join(directory, "tokenizer.json"))
    if with_config:
        config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<s>", "eos_token": "</s>",
                  "unk_token": "<unk>", "add_bos_token": False, "add_prefix_space": False,
                  "clean_up_tokenization_spaces": False, "model_max_length": 64}
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)


def write_spm_tokenizer(directory):
    """The same token texts in the layout of Llama 2's tokenizer.json (SentencePiece converted to a
    BPE with byte fallback): spaces are "\u2581", the single bytes b"\xc3" b"\xe2" b"\x82" b"\xac" are
    the byte tokens <0xC3> <0xE2> <0x82> <0xAC>, and 76 (b"\xa9t" above) is <0xA9>; the normalizer
    prepends "\u2581" and the decoder is Replace("\u2581", " "), ByteFallback, Fuse, Strip(" ", 1, 0),
    which drops the first leading space of a decoded text. tokenizer_config.json names LlamaTokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for i, piece in enumerate(token_bytes()):
        if i < len(SPECIALS):
            continue
        if i == 76:
            piece = b"\xa9"
        text = "<0x%02X>" % piece[0] if len(piece) == 1 and piece[0] >= 0x80 else piece.decode().replace(" ", "\u2581")
        assert text not in vocab, (i, piece)
        vocab[text] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE
    tok.save(os.path.join(directory, "tokenizer.json"))
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "add_bos_token": False, "add_eos_token": False, "legacy": False,
              "clean_up_tokenization_spaces": False, "model_max_length": 64}
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)

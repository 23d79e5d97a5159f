#!/usr/bin/env python3
"""Differential test of the specs and the codec: random messages per dialect
are encoded by an independent encoder (pyiso8583) from an independent field
table, framed, and decoded by `isoswitch decode --json --reveal`; every field
value must come back as it was sent.

The reference tables below are transcribed from the jPOS packagers
(Base1Packager for visa-base1, ISO87APackager for iso87ascii, and for
iso87binary the same table with a binary bitmap, as jPOS's
ISO87APackagerBBitmap), and ISO93BPackager for iso93binary, with the
deliberate differences docs/specs.md lists; mastercard's from
Shulyaka/iso8583tools' Mastercard field table (parser/formats/fields_mast.frm).
cups and cup-pos have no public jPOS packager: their tables are the ISO 8583
base with the dialect's lengths, so for them this checks the codec against
pyiso8583 more than the spec against the dialect.

    scripts/differential.py [--messages N] [--seed S] [--isoswitch PATH]
"""
import argparse
import json
import random
import string
import subprocess
import sys

try:
    import iso8583
except ImportError:
    sys.exit("differential.py: pyiso8583 is missing: python3 -m pip install pyiso8583")

# Field kinds: (format, max length, data)
#   format: "f" fixed, "ll" / "lll" variable with that many length digits
#   data:   "n" digits, "z" track data (digits and D), "ans" text, "b" bytes,
#           "xn" amount with a C/D sign (text in ASCII dialects; raw bytes in VISA)
F, LL, LLL = "f", "ll", "lll"

# ISO 8583:1987 as jPOS ISO87APackager has it.
ISO87 = {
    2: (LL, 19, "n"), 3: (F, 6, "n"), 4: (F, 12, "n"), 5: (F, 12, "n"), 6: (F, 12, "n"),
    7: (F, 10, "n"), 8: (F, 8, "n"), 9: (F, 8, "n"), 10: (F, 8, "n"), 11: (F, 6, "n"),
    12: (F, 6, "n"), 13: (F, 4, "n"), 14: (F, 4, "n"), 15: (F, 4, "n"), 16: (F, 4, "n"),
    17: (F, 4, "n"), 18: (F, 4, "n"), 19: (F, 3, "n"), 20: (F, 3, "n"), 21: (F, 3, "n"),
    22: (F, 3, "n"), 23: (F, 3, "n"), 24: (F, 3, "n"), 25: (F, 2, "n"), 26: (F, 2, "n"),
    27: (F, 1, "n"), 28: (F, 9, "xn"), 29: (F, 9, "xn"), 30: (F, 9, "xn"), 31: (F, 9, "xn"),
    32: (LL, 11, "n"), 33: (LL, 11, "n"), 34: (LL, 28, "ans"), 35: (LL, 37, "z"),
    36: (LLL, 104, "ans"), 37: (F, 12, "ans"), 38: (F, 6, "ans"), 39: (F, 2, "ans"),
    40: (F, 3, "ans"), 41: (F, 8, "ans"), 42: (F, 15, "ans"), 43: (F, 40, "ans"),
    44: (LL, 25, "ans"), 45: (LL, 76, "ans"), 46: (LLL, 999, "ans"), 47: (LLL, 999, "ans"),
    48: (LLL, 999, "ans"), 49: (F, 3, "ans"), 50: (F, 3, "ans"), 51: (F, 3, "ans"),
    52: (F, 8, "b"), 53: (F, 16, "n"), 54: (LLL, 120, "ans"), 55: (LLL, 999, "b"),
    56: (LLL, 999, "ans"), 57: (LLL, 999, "ans"), 58: (LLL, 999, "ans"), 59: (LLL, 999, "ans"),
    60: (LLL, 999, "ans"), 61: (LLL, 999, "ans"), 62: (LLL, 999, "ans"), 63: (LLL, 999, "ans"),
    64: (F, 8, "b"), 66: (F, 1, "n"), 67: (F, 2, "n"), 68: (F, 3, "n"), 69: (F, 3, "n"),
    70: (F, 3, "n"), 71: (F, 4, "n"), 72: (F, 4, "n"), 73: (F, 6, "n"),
    **{i: (F, 10, "n") for i in range(74, 82)},
    **{i: (F, 12, "n") for i in range(82, 86)},
    **{i: (F, 16, "n") for i in range(86, 90)},
    90: (F, 42, "n"), 91: (F, 1, "ans"), 92: (F, 2, "ans"), 94: (F, 7, "ans"),
    95: (F, 42, "ans"), 96: (F, 8, "b"), 97: (F, 17, "xn"), 98: (F, 25, "ans"),
    99: (LL, 11, "n"), 100: (LL, 11, "n"), 101: (LL, 17, "ans"), 102: (LL, 28, "ans"),
    103: (LL, 28, "ans"), 104: (LLL, 100, "ans"),
    **{i: (LLL, 999, "ans") for i in range(105, 128)},
    128: (F, 8, "b"),
}
# Deliberate differences from ISO87APackager (docs/specs.md): F52, F64, F96 and
# F128 raw bytes (jPOS: hex text), F55 raw bytes (jPOS: text); F93 is an 5 as in
# ISO 8583:1987 (jPOS: 6) and is left out here.

# VISA BASE I as jPOS Base1Packager has it. LLH = one binary length byte.
# Text is EBCDIC (code page 037) throughout, also where jPOS uses ASCII
# (IFB_LLHCHAR); F36 is left out (jPOS: LLL with a BCD length; BASE I does not
# carry track 3).
BASE1 = {
    **{i: ISO87[i] for i in range(2, 28)},
    22: (F, 4, "n"),
    28: (F, 9, "xn"), 29: (F, 9, "xn"), 30: (F, 9, "xn"), 31: (F, 9, "xn"),
    32: (LL, 11, "n"), 33: (LL, 11, "n"), 34: (LL, 28, "n"), 35: (LL, 37, "z"),
    **{i: ISO87[i] for i in range(37, 44)},
    44: (LL, 25, "ans"), 45: (LL, 76, "ans"), 46: (LL, 99, "ans"), 47: (LL, 99, "ans"),
    48: (LL, 99, "b"), 49: (F, 3, "n"), 50: (F, 3, "n"), 51: (F, 3, "n"), 52: (F, 8, "b"),
    53: (F, 16, "n"), 54: (LL, 120, "ans"), 55: (LL, 255, "b"), 56: (LL, 99, "ans"),
    57: (LL, 99, "ans"), 58: (LL, 99, "ans"), 59: (LL, 14, "ans"), 60: (LL, 6, "b"),
    61: (LL, 36, "n"), 62: (LL, 59, "b"), 63: (LL, 255, "b"), 64: (F, 8, "b"),
    **{i: ISO87[i] for i in range(66, 91)},
    91: (F, 1, "ans"), 92: (F, 2, "ans"), 93: (F, 5, "ans"), 94: (F, 7, "ans"),
    95: (F, 42, "ans"), 96: (F, 8, "b"), 97: (F, 17, "xn"), 98: (F, 25, "ans"),
    99: (LL, 11, "n"), 100: (LL, 11, "n"), 101: (LL, 17, "ans"), 102: (LL, 28, "ans"),
    103: (LL, 28, "ans"), 104: (LL, 99, "ans"),
    **{i: (LL, 99, "ans") for i in range(105, 118)},
    115: (LL, 24, "ans"), 118: (LL, 99, "b"), 119: (LL, 99, "ans"), 120: (LL, 4, "n"),
    121: (LL, 11, "ans"), 122: (LL, 13, "ans"), 123: (LL, 29, "ans"), 124: (LL, 99, "b"),
    125: (LL, 99, "ans"), 126: (LL, 255, "b"), 127: (LL, 255, "b"), 128: (F, 8, "b"),
}

# UnionPay inter-institution (CUPS): ISO 8583 ASCII with the CUPS lengths.
CUPS = {**ISO87, 48: (LLL, 512, "ans"), 57: (LLL, 100, "ans"), 59: (LLL, 600, "ans"),
        60: (LLL, 100, "ans"), 61: (LLL, 200, "ans"), 62: (LLL, 200, "ans"),
        63: (LLL, 512, "ans"), 121: (LLL, 100, "ans"), 122: (LLL, 100, "ans"),
        123: (LLL, 100, "ans")}

# UnionPay POS: BCD numerics and BCD lengths; text fields ASCII.
CUP_POS = {
    **{i: v for i, v in ISO87.items() if v[2] in ("n", "z", "b")},
    **{i: v for i, v in ISO87.items() if v[2] in ("ans",) and i in range(37, 48)},
    28: (F, 9, "xn"), 29: (F, 9, "xn"), 30: (F, 9, "xn"), 31: (F, 9, "xn"),
    34: (LL, 28, "ans"), 36: (LLL, 104, "z"), 48: (LLL, 322, "n"), 49: (F, 3, "ans"),
    50: (F, 3, "n"), 51: (F, 3, "n"), 55: (LLL, 999, "b"), 60: (LLL, 17, "n"),
    61: (LLL, 29, "n"), 62: (LLL, 512, "b"), 63: (LLL, 163, "ans"),
}

# ISO 8583:1993, binary, as jPOS ISO93BPackager has it: IFB_NUMERIC and
# IFB_LLNUM are BCD digits (right-aligned), IF_CHAR / IFB_LLCHAR / IFB_LLLCHAR
# ASCII text, IFB_*BINARY raw bytes, every length prefix BCD; the MTI is 4 BCD
# digits. F97 is IFB_AMOUNT(1+16): a sign and 16 BCD digits, carried raw.
# F65 (IFB_BINARY 8) is left out: pyiso8583 takes bit 65 for a tertiary
# bitmap and encodes no field 65.
ISO93B = {
    2: (LL, 19, "n"), 3: (F, 6, "n"), 4: (F, 12, "n"), 5: (F, 12, "n"), 6: (F, 12, "n"),
    7: (F, 10, "n"), 8: (F, 8, "n"), 9: (F, 8, "n"), 10: (F, 8, "n"), 11: (F, 6, "n"),
    12: (F, 12, "n"), 13: (F, 4, "n"), 14: (F, 4, "n"), 15: (F, 6, "n"), 16: (F, 4, "n"),
    17: (F, 4, "n"), 18: (F, 4, "n"), 19: (F, 3, "n"), 20: (F, 3, "n"), 21: (F, 3, "n"),
    22: (F, 12, "ans"), 23: (F, 3, "n"), 24: (F, 3, "n"), 25: (F, 4, "n"), 26: (F, 4, "n"),
    27: (F, 1, "n"), 28: (F, 6, "n"), 29: (F, 3, "n"), 30: (F, 24, "n"), 31: (LL, 99, "ans"),
    32: (LL, 11, "n"), 33: (LL, 11, "n"), 34: (LL, 28, "ans"), 35: (LL, 37, "ans"),
    36: (LLL, 104, "ans"), 37: (F, 12, "ans"), 38: (F, 6, "ans"), 39: (F, 3, "n"),
    40: (F, 3, "n"), 41: (F, 8, "ans"), 42: (F, 15, "ans"), 43: (LL, 99, "ans"),
    44: (LL, 99, "ans"), 45: (LL, 76, "ans"), 46: (LLL, 204, "ans"), 47: (LLL, 999, "ans"),
    48: (LLL, 999, "ans"), 49: (F, 3, "ans"), 50: (F, 3, "ans"), 51: (F, 3, "ans"),
    52: (F, 8, "b"), 53: (LL, 48, "b"), 54: (LLL, 120, "ans"), 55: (LLL, 255, "b"),
    56: (LL, 35, "n"), 57: (F, 3, "n"), 58: (LL, 11, "n"), 59: (LLL, 999, "ans"),
    **{i: (LLL, 999, "ans") for i in range(60, 64)},
    64: (F, 8, "b"), 66: (LLL, 204, "ans"), 67: (F, 2, "n"), 68: (F, 3, "n"),
    69: (F, 3, "n"), 70: (F, 3, "n"), 71: (F, 8, "n"), 72: (LLL, 999, "ans"), 73: (F, 6, "n"),
    **{i: (F, 10, "n") for i in range(74, 86)},
    **{i: (F, 16, "n") for i in range(86, 90)},
    90: (F, 10, "n"), 91: (F, 3, "n"), 92: (F, 3, "n"), 93: (LL, 11, "n"), 94: (LL, 11, "n"),
    95: (LL, 99, "ans"), 96: (LLL, 999, "b"), 97: (F, 17, "xn"), 98: (F, 25, "ans"),
    99: (LL, 11, "ans"), 100: (LL, 11, "n"), 101: (LL, 17, "ans"), 102: (LL, 28, "ans"),
    103: (LL, 28, "ans"), 104: (LLL, 100, "ans"), 105: (F, 16, "n"), 106: (F, 16, "n"),
    107: (F, 10, "n"), 108: (F, 10, "n"), 109: (LL, 84, "ans"), 110: (LL, 84, "ans"),
    **{i: (LLL, 999, "ans") for i in range(111, 128)},
    128: (F, 8, "b"),
}

# Mastercard authorization interface as Shulyaka/iso8583tools has it
# (parser/formats/fields_mast.frm): EBCDIC everywhere ("EBCDIC" data, "EE" /
# "EEE" EBCDIC LL / LLL lengths), "HEX" fields raw bytes, DE 55 raw BER-TLV.
# Left out: the fields that table does not define (56-59, 65, 71-89, 93,
# 97-99, 105-111), DE 45 ("B76", a length form the table does not explain)
# and DE 128 ("EE8HEX": an LL MAC, where the Mastercard descriptions give b 64).
MASTERCARD = {
    2: (LL, 19, "n"), 3: (F, 6, "n"), 4: (F, 12, "n"), 5: (F, 12, "n"), 6: (F, 12, "n"),
    7: (F, 10, "n"), 8: (F, 8, "n"), 9: (F, 8, "n"), 10: (F, 8, "n"), 11: (F, 6, "n"),
    12: (F, 6, "n"), 13: (F, 4, "n"), 14: (F, 4, "n"), 15: (F, 4, "n"), 16: (F, 4, "n"),
    17: (F, 4, "n"), 18: (F, 4, "n"), 19: (F, 3, "n"), 20: (F, 3, "n"), 21: (F, 3, "n"),
    22: (F, 3, "n"), 23: (F, 3, "n"), 24: (F, 3, "n"), 25: (F, 2, "n"), 26: (F, 2, "n"),
    27: (F, 1, "n"), 28: (F, 9, "xn"), 29: (F, 9, "xn"), 30: (F, 9, "xn"), 31: (F, 9, "xn"),
    32: (LL, 6, "n"), 33: (LL, 6, "n"), 34: (LL, 28, "ans"), 35: (LL, 37, "z"),
    36: (LLL, 104, "ans"), 37: (F, 12, "ans"), 38: (F, 6, "ans"), 39: (F, 2, "ans"),
    40: (F, 3, "ans"), 41: (F, 8, "ans"), 42: (F, 15, "ans"), 43: (F, 40, "ans"),
    44: (LL, 25, "ans"), 46: (LLL, 999, "ans"), 47: (LLL, 999, "ans"), 48: (LLL, 999, "ans"),
    49: (F, 3, "n"), 50: (F, 3, "n"), 51: (F, 3, "n"), 52: (F, 8, "b"), 53: (F, 16, "n"),
    54: (LLL, 120, "ans"), 55: (LLL, 255, "b"), 60: (LLL, 60, "ans"), 61: (LLL, 26, "ans"),
    62: (LLL, 100, "ans"), 63: (LLL, 50, "ans"), 64: (F, 8, "b"), 66: (F, 1, "n"),
    67: (F, 2, "n"), 68: (F, 3, "n"), 69: (F, 3, "n"), 70: (F, 3, "n"), 90: (F, 42, "n"),
    91: (F, 1, "ans"), 92: (F, 2, "ans"), 94: (F, 7, "ans"), 95: (F, 42, "n"),
    96: (F, 8, "ans"), 100: (LL, 11, "n"), 101: (LL, 17, "ans"), 102: (LL, 28, "ans"),
    103: (LL, 28, "ans"), 104: (LLL, 100, "ans"), 112: (LLL, 100, "ans"),
    **{i: (LLL, 999, "ans") for i in range(113, 121)},
    121: (LLL, 6, "n"), 122: (LLL, 999, "ans"), 123: (LLL, 512, "ans"),
    124: (LLL, 199, "ans"), 125: (F, 8, "b"), 126: (LLL, 100, "ans"), 127: (LLL, 100, "ans"),
}

# UnionPay POS puts odd-length BCD values first and the pad nibble last:
# PAN and track data padded with F, F22 and the institution codes with 0.
CUP_POS_LEFT = {2: "F", 35: "F", 36: "F", 22: "0", 32: "0", 33: "0", 48: "0", 60: "0",
                61: "0", 99: "0", 100: "0"}

DIALECTS = {
    # name: (table, text codec, numeric "ascii"/"bcd", length encoding, MTI/bitmap, prefix, envelope)
    "visa-base1": (BASE1, "cp037", "bcd", "b", ("bcd", "b"), "visa4", "visa"),
    "iso87ascii": (ISO87, "ascii", "ascii", "ascii", ("ascii", "ascii"), "ascii4", None),
    "iso87binary": (ISO87, "ascii", "ascii", "ascii", ("ascii", "b"), "binary2", None),
    "cups": (CUPS, "ascii", "ascii", "ascii", ("ascii", "b"), "ascii4", "cups"),
    "cup-pos": (CUP_POS, "ascii", "bcd", "bcd", ("bcd", "b"), "binary2", "pos"),
    "iso93binary": (ISO93B, "ascii", "bcd", "bcd", ("bcd", "b"), "binary2", None),
    "mastercard": (MASTERCARD, "cp037", "ascii", "cp037", ("ebcdic", "b"), "binary2", None),
}
# Dialects whose signed amounts (x+n: a sign byte and BCD digits) are carried
# as raw bytes.
RAW_AMOUNTS = {"visa-base1", "iso93binary"}
# MTIs per dialect: version 0 (1987) unless listed.
MTIS_1987 = ["0100", "0110", "0200", "0210", "0400", "0420", "0800", "0810"]
MTIS = {"iso93binary": ["1100", "1110", "1200", "1210", "1420", "1430", "1804", "1814"]}
TEXT = string.ascii_letters + string.digits + " ./-"


def field_spec(kind, codec, numeric, len_enc, right_pad=None, raw_amount=False):
    fmt, max_len, data = kind
    len_type = {F: 0, LL: 1 if len_enc in ("b", "bcd") else 2, LLL: 2 if len_enc in ("b", "bcd") else 3}[fmt]
    if fmt == LL and len_enc == "b":
        len_type = 1
    spec = {"len_type": len_type, "max_len": max_len, "len_enc": len_enc, "desc": ""}
    if data in ("n", "z") and numeric == "bcd":
        spec.update(data_enc="b", len_count="nibbles")
        if right_pad:
            spec["right_pad"] = right_pad
        else:
            spec["left_pad"] = "0"
    elif data == "b":
        spec.update(data_enc="b", len_count="bytes")
    elif data == "xn" and raw_amount:
        # VISA / 1993 binary x+n: a sign byte and BCD digits, carried as raw bytes.
        spec.update(data_enc="b", len_count="bytes", max_len=1 + max_len // 2)
    else:
        spec.update(data_enc=codec, len_count="bytes")
    return spec


def pyiso_spec(name):
    table, codec, numeric, len_enc, (mti_enc, bitmap_enc), _, _ = DIALECTS[name]
    spec = {
        "h": {"data_enc": "ascii", "len_type": 0, "max_len": 0, "len_enc": "ascii", "desc": ""},
        "t": {"data_enc": "b" if mti_enc == "bcd" else codec, "len_type": 0, "max_len": 4,
              "len_enc": "ascii", "desc": ""},
        "p": {"data_enc": bitmap_enc, "len_type": 0, "max_len": 8, "len_enc": "ascii", "desc": ""},
        "1": {"data_enc": bitmap_enc, "len_type": 0, "max_len": 8, "len_enc": "ascii", "desc": ""},
    }
    for fid, kind in table.items():
        pad = CUP_POS_LEFT.get(fid) if name == "cup-pos" else None
        spec[str(fid)] = field_spec(kind, codec, numeric, len_enc, pad, name in RAW_AMOUNTS)
    return spec


def random_value(rng, kind, raw_amount):
    fmt, max_len, data = kind
    n = max_len if fmt == F else rng.randint(0 if data != "xn" else 1, min(max_len, 60))
    if data == "n":
        return "".join(rng.choice(string.digits) for _ in range(n))
    if data == "z":
        s = "".join(rng.choice(string.digits) for _ in range(n))
        return s if n < 3 else s[:n // 2] + "D" + s[n // 2 + 1:]
    if data == "b":
        n = max_len if fmt == F else rng.randint(0, min(max_len, 60))
        return "".join(rng.choice("0123456789ABCDEF") for _ in range(2 * n))
    if data == "xn":
        digits = "".join(rng.choice(string.digits) for _ in range(max_len - 1))
        if raw_amount:
            sign = rng.choice(["C3", "C4", "43", "44"])  # C / D, EBCDIC or ASCII
            return sign + (("0" + digits) if len(digits) % 2 else digits)
        return rng.choice("CD") + digits
    return "".join(rng.choice(TEXT) for _ in range(n))


def envelope(kind, body_len):
    if kind == "cups":
        total = 46 + body_len
        return (bytes([46, 2]) + f"{total:04d}".encode() + b"00010000   " + b"03105840   "
                + b"\0\0\0" + b"\0" + b"00000000" + b"\0" + b"00000")
    if kind == "visa":
        total = 22 + body_len
        return (bytes([22, 1, 2]) + total.to_bytes(2, "big") + bytes([0, 0, 1, 0x45, 0x67, 0x89])
                + bytes(11))
    if kind == "pos":
        return bytes([0x60, 0x00, 0x03, 0x00, 0x00, 0x60, 0x31, 0x00, 0x31, 0x07, 0x30])
    return b""


def frame(prefix, payload):
    n = len(payload)
    if prefix == "ascii4":
        return f"{n:04d}".encode() + payload
    if prefix == "binary2":
        return n.to_bytes(2, "big") + payload
    if prefix == "visa4":
        return n.to_bytes(2, "big") + b"\0\0" + payload
    raise ValueError(prefix)


def expected(value, kind, dialect):
    """What isoswitch shows for a value pyiso8583 encoded."""
    _, _, data = kind
    raw = dialect in RAW_AMOUNTS
    if data == "b" or (data == "xn" and raw):
        return value.upper()
    return value


def run(name, count, rng, binary, spec_arg):
    table, _, _, _, (mti_enc, _), prefix, env = DIALECTS[name]
    spec = pyiso_spec(name)
    ids = sorted(table)
    sent, stream = [], b""
    for _ in range(count):
        doc = {"t": rng.choice(MTIS.get(name, MTIS_1987))}
        for fid in rng.sample(ids, rng.randint(1, 25)):
            doc[str(fid)] = random_value(rng, table[fid], name in RAW_AMOUNTS)
        values = {k: v for k, v in doc.items() if k.isdigit()}
        body, _ = iso8583.encode(dict(doc), spec)
        body = bytes(body)
        stream += frame(prefix, envelope(env, len(body)) + body)
        sent.append((doc["t"], values))
    out = subprocess.run([binary, "decode", "--spec", spec_arg, "--json", "--reveal", "--raw"],
                         input=stream, capture_output=True)
    # split("\n"), not splitlines(): JSON strings may hold U+0085 or U+2028.
    lines = [l for l in out.stdout.decode().split("\n") if l.strip()]
    failures = []
    if len(lines) != len(sent):
        failures.append(f"{len(lines)} messages decoded of {len(sent)}: {out.stderr.decode()[:500]}")
    for i, (line, (mti, values)) in enumerate(zip(lines, sent)):
        got = json.loads(line)
        if got.get("mti") != mti:
            failures.append(f"message {i}: MTI {got.get('mti')} != {mti}")
        fields = got.get("fields", {})
        for fid, value in values.items():
            want = expected(value, table[int(fid)], name)
            if fields.get(fid) != want:
                failures.append(f"message {i} F{fid} {table[int(fid)]}: isoswitch {fields.get(fid)!r}, sent {want!r}")
        extra = set(fields) - set(values)
        if extra:
            failures.append(f"message {i}: fields not sent: {sorted(extra)}")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=300)
    ap.add_argument("--seed", type=int, default=8583)
    ap.add_argument("--isoswitch", default="target/debug/isoswitch")
    ap.add_argument("--spec-file", action="append", default=[], metavar="NAME=PATH",
                    help="decode dialect NAME with this spec file instead of the builtin")
    ap.add_argument("dialects", nargs="*", default=list(DIALECTS))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    files = dict(a.split("=", 1) for a in args.spec_file)
    bad = 0
    for name in args.dialects:
        failures = run(name, args.messages, rng, args.isoswitch, files.get(name, name))
        print(f"{name}: {args.messages} messages, {len(failures)} differences")
        for f in failures[:15]:
            print("   ", f)
        bad += len(failures)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

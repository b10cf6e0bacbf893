"""Seeded test strings for tokenizers: the text a byte-level BPE tokenizer meets in a chat
server and the corners where implementations drift apart.

Used by tests/tokenizer_parity.py (parity of `ringctl tokenize` with HF `tokenizers`) and
bench/tokenizer_bench.py (the benchmark corpus). Everything is a pure function of the
`random.Random` passed in, so a seed reproduces a failing string.

Categories: ASCII prose (contractions, case), code (Python/C++/JSON/HTML, tabs, long
indents), CJK (Han, kana, Hangul, fullwidth punctuation), emoji (ZWJ families, skin tones,
flags, keycaps, variation selectors), combining marks and NFC-sensitive text (stacked
diacritics in non-canonical order, conjoining Hangul jamo, singletons, composition
exclusions), whitespace (\\r\\n, tabs, long runs, U+00A0/U+3000/U+2028/U+0085...), digit
runs (ASCII and other Nd/Nl/No digits), other scripts, letters and digits new in Unicode
15/16, control characters, added tokens
embedded in text, near misses of added tokens, very long words, and a soup of code points
from many Unicode blocks.

The soup keeps characters whose general category is the same in Unicode 3.2 and in this
Python's Unicode data, so its failures point at logic rather than at table versions;
the Unicode-version differences that matter (new letters and digits, U+180E) have their
own category.
"""
import random
import unicodedata

WORDS = (
    "the of and to in is was for that on as with by it at from his an were are which this be "
    "has or had not but first one their its new after who they have her she two been other "
    "when there all during into school time may years more most only over city some world "
    "would where later up such used many can state about national out known university "
    "united then made model token server ring stage latency throughput prompt decode cache "
    "attention expert weight tensor kernel memory bandwidth request stream sample network "
    "quick brown fox jumps lazy dog hello goodbye please thanks question answer reasoning "
    "function variable return value string integer float boolean array object"
).split()

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M",
                "'LL", "'D", "'ſ", "\u2019s", "''", "'", "'x", "'Ll", "'rE"]

PUNCT = list(".,;:!?-()[]{}\"'/\\@#$%^&*_+=<>|`~") + ["...", "--", "?!", "!!", "…", "—", "–",
                                                       "«", "»", "“", "”", "‘", "’", "•"]

SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\t\t", "\x0b", "\x0c",
          "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\u1680", "\u2002", "\u2003",
          "\u2009", "\u200a", "\u202f", "\u205f", "\u200b", "\ufeff", " \t ", "\n \n",
          "\u180e"]

EMOJI_BASE = [chr(c) for c in list(range(0x1F600, 0x1F650)) + list(range(0x1F300, 0x1F321)) +
              list(range(0x1F680, 0x1F6C6)) + list(range(0x1F90C, 0x1F93B)) +
              list(range(0x2600, 0x2605)) + [0x2764, 0x2728, 0x2705, 0x274C, 0x1FAE0, 0x1FAE8]]
SKIN = [chr(c) for c in range(0x1F3FB, 0x1F400)]
ZWJ_SEQUENCES = [
    "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",  # family
    "\U0001F469\U0001F3FD\u200D\U0001F4BB",                        # woman technologist
    "\U0001F3F3\uFE0F\u200D\U0001F308",                            # rainbow flag
    "\U0001F441\uFE0F\u200D\U0001F5E8\uFE0F",                      # eye in speech bubble
    "\U0001F9D1\U0001F3FF\u200D\U0001F91D\u200D\U0001F9D1\U0001F3FB",
    "\u2764\uFE0F\u200D\U0001F525",
    "\U0001F408\u200D\u2B1B",
]
FLAGS = ["\U0001F1EF\U0001F1F5", "\U0001F1FA\U0001F1F8", "\U0001F1E9\U0001F1EA",
         "\U0001F1E8\U0001F1F3", "\U0001F1EB\U0001F1F7"]
KEYCAPS = [d + "\uFE0F\u20E3" for d in "0123456789#*"]

COMBINING = [chr(c) for c in range(0x0300, 0x0370)] + ["\u0483", "\u0591", "\u05B0", "\u05BC",
                                                     "\u064B", "\u0650", "\u093C", "\u0E31",
                                                     "\u1AB0", "\u1DC0", "\u20D0", "\uFE20"]
NFC_SENSITIVE = [
    "e\u0301", "a\u0308", "o\u0302\u0301", "e\u0323\u0302", "e\u0302\u0323", "a\u0323\u0301",
    "a\u0301\u0323", "u\u031b\u0309", "A\u030a", "\u212b", "\u2126", "\u212a", "\u0340",
    "\u0341", "\u0343", "\u0344", "\u0374", "\u037e", "\u0387", "\u1f71", "\u1fee",
    "\u1100\u1161", "\u1100\u1161\u11a8", "\u1112\u1175\u11bc", "\uac00\u11a8", "\u0915\u093c",
    "\u0958", "\u09c7\u09be", "\u0b47\u0b3e", "\u0f73", "\u0f71\u0f72", "\uf900", "\ufa10",
    "\u2adc", "\u2add\u0338", "\u00c5", "\u00e9", "\u1e9b\u0323", "\u0071\u0307\u0323",
    "\u05d1\u05bc\u05b7", "\u05d1\u05b7\u05bc", "\u0627\u0653", "\u0648\u0654", "i\u0307",
    "\u03b9\u0308\u0301", "\u0cc6\u0cc2\u0cd5", "\u0d46\u0d3e", "\u1025\u102e", "\u3099",
    "\u304b\u3099", "\u30cf\u309a", "\uff76\uff9e",
]

DIGITS_OTHER = [chr(c) for c in list(range(0x0660, 0x066A)) + list(range(0x0966, 0x0970)) +
                list(range(0xFF10, 0xFF1A)) + list(range(0x2160, 0x2170)) +
                list(range(0x2460, 0x2474)) + [0xB2, 0xB3, 0xB9, 0xBC, 0xBD, 0x2155, 0x3007,
                                               0x4E00, 0x1D7CE, 0x1D7D8, 0x1F100]]

SCRIPTS = {
    "greek": (0x03B1, 0x03C9), "greek_up": (0x0391, 0x03A9), "cyrillic": (0x0430, 0x044F),
    "arabic": (0x0621, 0x064A), "hebrew": (0x05D0, 0x05EA), "thai": (0x0E01, 0x0E30),
    "devanagari": (0x0905, 0x0939), "armenian": (0x0561, 0x0586), "georgian": (0x10D0, 0x10F0),
    "ethiopic": (0x1200, 0x1248), "latin_ext": (0x0100, 0x017F), "ipa": (0x0250, 0x02AF),
    "hangul": (0xAC00, 0xD7A3), "han": (0x4E00, 0x9FA5), "hiragana": (0x3041, 0x3096),
    "katakana": (0x30A1, 0x30FA), "math_alnum": (0x1D400, 0x1D4FF), "box": (0x2500, 0x257F),
    "arrows": (0x2190, 0x21FF), "math": (0x2200, 0x22FF), "currency": (0x20A0, 0x20BF),
    "fullwidth": (0xFF01, 0xFF5E), "cjk_punct": (0x3000, 0x303F),
}

# Letters and digits Unicode 15/16 added (CJK Ext H/I, Kawi, Nag Mundari, Garay, Kirat Rai,
# Cyrillic): Oniguruma (Unicode 16) has them in \p{L}/\p{N}, PCRE2 10.42 (Unicode 14) not.
NEW_UNICODE = [(0x31350, 0x323AF), (0x2EBF0, 0x2EE5D), (0x11F04, 0x11F10), (0x11F50, 0x11F59),
               (0x1E4D0, 0x1E4EA), (0x1E4F0, 0x1E4F9), (0x10D4A, 0x10D65), (0x10D40, 0x10D49),
               (0x16D70, 0x16D79), (0x1C89, 0x1C8A)]

# Blocks the soup draws from (start, end inclusive).
SOUP_BLOCKS = [(0x20, 0x7E), (0xA0, 0x24F), (0x250, 0x36F), (0x370, 0x52F), (0x530, 0x6FF),
               (0x900, 0xDFF), (0xE00, 0xEFF), (0x1000, 0x109F), (0x10A0, 0x11FF),
               (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x2E80, 0x31FF), (0x3200, 0x4DBF),
               (0x4E00, 0x9FFF), (0xA000, 0xA4CF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF),
               (0xFB00, 0xFFFD), (0x10000, 0x1034F), (0x1D400, 0x1D7FF), (0x1F000, 0x1FAFF),
               (0x20000, 0x2A6D6), (0xE000, 0xE0FF), (0x0, 0x1F), (0x7F, 0x9F)]


def stable_char(cp):
    """True for code points every Unicode version involved classifies alike."""
    c = chr(cp)
    if 0xD800 <= cp <= 0xDFFF:
        return False
    cat = unicodedata.category(c)
    if cat == "Cn":
        return False
    if cat == "Co":
        return True
    return unicodedata.ucd_3_2_0.category(c) == cat


def _soup_table():
    table = []
    for lo, hi in SOUP_BLOCKS:
        table.extend(cp for cp in range(lo, hi + 1) if stable_char(cp))
    return table


_SOUP = None


def soup_char(rng):
    global _SOUP
    if _SOUP is None:
        _SOUP = _soup_table()
    return chr(rng.choice(_SOUP))


def word(rng):
    r = rng.random()
    if r < 0.6:
        w = rng.choice(WORDS)
    else:  # pseudo-words give BPE training (and tests) unseen words
        syll = ["ka", "to", "ri", "an", "es", "qu", "str", "ph", "ing", "tion", "er", "ou",
                "ze", "lo", "mi", "nd", "th", "sh", "ch", "ee", "oo", "y", "x", "b", "k"]
        w = "".join(rng.choice(syll) for _ in range(rng.randint(1, 4)))
    r = rng.random()
    if r < 0.1:
        w = w.capitalize()
    elif r < 0.13:
        w = w.upper()
    return w


def prose(rng, n_words=None):
    n = n_words or rng.randint(3, 40)
    out = []
    for i in range(n):
        w = word(rng)
        if rng.random() < 0.05:
            w += rng.choice(CONTRACTIONS)
        out.append(w)
        if rng.random() < 0.12:
            out.append(rng.choice(PUNCT))
    text = " ".join(out)
    if rng.random() < 0.5:
        text = text[:1].upper() + text[1:] + rng.choice([".", "!", "?", "", "\n"])
    return text


def code(rng):
    ind = rng.choice(["    ", "  ", "\t", "        ", "\t\t"])
    name = word(rng).lower()
    snippets = [
        f"def {name}(x, y={rng.randint(0, 999)}):\n{ind}return x ** 2 + y  # {word(rng)}\n",
        f"for (int i = 0; i < {rng.randint(1, 100000)}; ++i) {{\n{ind}sum += a[i] * b[i];\n}}",
        f'{{"{name}": [{rng.randint(0, 99)}, {rng.random():.4f}, null, true], "k": "{word(rng)}"}}',
        f"<div class=\"{name}\">\n{ind}<p>{prose(rng, 5)}</p>\n</div>",
        f"if x != {rng.randint(0, 9)} && y >= 0x{rng.randint(0, 65535):04X}:\n{ind}pass\r\n",
        f"SELECT {name}, COUNT(*) FROM t WHERE id = {rng.randint(0, 10**9)} GROUP BY 1;",
        f"std::vector<int32_t> {name}{{1, 2, 3}};  // {prose(rng, 4)}",
        f"    x = [i for i in range({rng.randint(0, 50)})]\n\n\n    y = x[::-1]",
        f"$ ./build/bin --flag={name} -j{rng.randint(1, 64)} 2>&1 | tee log.txt",
        f"print(f'{{{name}!r:>10}}')\t# {rng.choice(['TODO', 'FIXME', 'NOTE'])}",
    ]
    return rng.choice(snippets)


def script_run(rng, key=None, n=None):
    lo, hi = SCRIPTS[key or rng.choice(list(SCRIPTS))]
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n or rng.randint(1, 12)))


def cjk(rng):
    parts = []
    for _ in range(rng.randint(1, 6)):
        k = rng.choice(["han", "han", "han", "hiragana", "katakana", "hangul", "cjk_punct",
                        "fullwidth"])
        parts.append(script_run(rng, k))
        if rng.random() < 0.3:
            parts.append(rng.choice(["。", "，", "！", "？", "、", "「", "」", " ", "：", "\n"]))
        if rng.random() < 0.15:
            parts.append(str(rng.randint(0, 99999)))
    return "".join(parts)


def emoji(rng):
    out = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.35:
            out.append(rng.choice(EMOJI_BASE))
        elif r < 0.55:
            out.append(rng.choice(EMOJI_BASE[:80]) + rng.choice(SKIN))
        elif r < 0.7:
            out.append(rng.choice(ZWJ_SEQUENCES))
        elif r < 0.8:
            out.append(rng.choice(FLAGS))
        elif r < 0.87:
            out.append(rng.choice(KEYCAPS))
        elif r < 0.93:
            out.append(rng.choice(EMOJI_BASE) + "\uFE0F")
        else:
            out.append(" " + word(rng) + " ")
    return "".join(out)


def combining(rng):
    out = []
    for _ in range(rng.randint(1, 10)):
        r = rng.random()
        if r < 0.4:
            out.append(rng.choice(NFC_SENSITIVE))
        elif r < 0.75:
            base = rng.choice("aeiouAEIOUnNcCsSzyq" + "αεοابকअ가")
            out.append(base + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 3))))
        elif r < 0.85:
            out.append(rng.choice(COMBINING))  # a mark with nothing to attach to
        else:
            out.append(rng.choice([" ", word(rng), "'", "1"]))
    return "".join(out)


def whitespace(rng):
    out = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.35:
            out.append(rng.choice(SPACES))
        elif r < 0.5:
            out.append(" " * rng.randint(2, 80))
        elif r < 0.6:
            out.append(rng.choice(["\n", "\r\n", "\t"]) * rng.randint(2, 20))
        else:
            out.append(rng.choice([word(rng), rng.choice(PUNCT), str(rng.randint(0, 99))]))
    return "".join(out)


def digits(rng):
    out = []
    for _ in range(rng.randint(1, 6)):
        r = rng.random()
        if r < 0.4:
            out.append(str(rng.randint(0, 10 ** rng.randint(1, 30))))
        elif r < 0.55:
            out.append(f"{rng.randint(0, 10**6):,}.{rng.randint(0, 999):03d}")
        elif r < 0.7:
            out.append("".join(rng.choice(DIGITS_OTHER) for _ in range(rng.randint(1, 8))))
        elif r < 0.8:
            out.append(f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
        else:
            out.append(rng.choice([" ", "x", "abc", "$", "%", "+", "=", "\n", "v1.2.3"]))
    return "".join(out)


def other_scripts(rng):
    return " ".join(script_run(rng) for _ in range(rng.randint(1, 6)))


def controls(rng):
    return "".join(rng.choice([chr(rng.randint(0, 0x1F)), chr(rng.randint(0x7F, 0x9F)),
                               word(rng), " ", "\u200d", "\u200c", "\u2060", "\ufeff"])
                   for _ in range(rng.randint(1, 10)))


def new_unicode(rng):
    out = []
    for _ in range(rng.randint(1, 8)):
        lo, hi = rng.choice(NEW_UNICODE)
        out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 5))))
        out.append(rng.choice(["", " ", "1", "a", ",", "\n", "'s"]))
    return "".join(out)


def soup(rng):
    return "".join(soup_char(rng) for _ in range(rng.randint(1, 40)))


def near_miss(rng, token):
    """Text that looks like an added token but is not (or contains it in odd company)."""
    ops = [
        lambda t: t[:-1],
        lambda t: t[1:],
        lambda t: t.upper(),
        lambda t: t[: len(t) // 2] + " " + t[len(t) // 2:],
        lambda t: t[: len(t) // 2],
        lambda t: t + t,
        lambda t: t[0] + t,
        lambda t: t.replace("|", "｜"),
        lambda t: t.replace("<", "&lt;"),
        lambda t: t[:-1] + " " + t[-1],
        lambda t: t + t[-1],
    ]
    return rng.choice(ops)(token)


def with_added_tokens(rng, tokens):
    """Prose/code/CJK with added tokens (and near misses) embedded."""
    out = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.35 and tokens:
            out.append(rng.choice(tokens))
        elif r < 0.5 and tokens:
            out.append(near_miss(rng, rng.choice(tokens)))
        elif r < 0.6 and tokens:
            out.append(rng.choice(tokens) + rng.choice(tokens))
        elif r < 0.7:
            out.append(rng.choice(SPACES) * rng.randint(1, 3))
        else:
            out.append(rng.choice([prose, code, cjk, emoji, digits])(rng))
    return "".join(out)


def very_long(rng):
    n = rng.randint(300, 6000)
    kind = rng.randrange(9)
    if kind == 0:
        return "a" * n
    if kind == 1:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
    if kind == 2:
        return script_run(rng, "han", n // 3)
    if kind == 3:
        return " " * n + "x"
    if kind == 4:
        return str(rng.randint(0, 9)) * n
    if kind == 5:
        return "".join(rng.choice(EMOJI_BASE) for _ in range(n // 4))
    if kind == 6:
        return "!" * (n // 2) + "\n" * (n // 2)
    if kind == 7:
        return "ab" * (n // 2)
    return "".join(rng.choice(["\n", " ", "\t", "\r\n"]) for _ in range(n // 2)) + "end"


CATEGORIES = [
    (prose, 15), (code, 10), (cjk, 9), (emoji, 8), (combining, 8), (whitespace, 8),
    (digits, 6), (other_scripts, 5), (controls, 3), (soup, 9), (new_unicode, 2),
]


def one_string(rng, added_tokens=()):
    """A test string: one category, a mix of several, added tokens, or a very long word."""
    r = rng.random()
    if r < 0.14:
        return with_added_tokens(rng, list(added_tokens))
    if r < 0.16:
        return very_long(rng)
    if r < 0.01 + 0.16:
        return ""
    funcs, weights = zip(*CATEGORIES)
    if r < 0.45:
        n = rng.randint(2, 5)
        sep = rng.choice(["", " ", "\n", "", "\t"])
        return sep.join(f(rng) for f in rng.choices(funcs, weights, k=n))
    return rng.choices(funcs, weights)[0](rng)


def strings(seed, count, added_tokens=()):
    rng = random.Random(seed)
    return [one_string(rng, added_tokens) for _ in range(count)]


def corpus(seed, target_bytes):
    """Realistic text for training and benchmarking: mostly prose and code, some CJK,
    emoji, digits, whitespace; lines of a few hundred bytes."""
    rng = random.Random(seed)
    out, size = [], 0
    weighted = [(prose, 40), (code, 20), (cjk, 12), (digits, 6), (emoji, 4), (whitespace, 6),
                (other_scripts, 6), (combining, 2), (soup, 4)]
    funcs, weights = zip(*weighted)
    while size < target_bytes:
        line = " ".join(f(rng) for f in rng.choices(funcs, weights, k=rng.randint(2, 8)))
        out.append(line)
        size += len(line.encode())
    return out

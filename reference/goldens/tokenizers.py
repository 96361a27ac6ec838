"""Tokenizer folders with real vocabularies and golden ids, as the diffusers pipelines tokenize.

Writes tests/fixtures/tokenizers/{clip,t5,mistral}/ and golden_ids.json, and the folder forms
transformers 5's save_pretrained writes (tokenizer.json + tokenizer_config.json, no vocab.json /
merges.txt / spiece.model) with golden_ids_json_form.json (see make_json_forms).
Pipeline goldens import the build_* functions to put the same tokenizers into their folders.

* CLIP: the real 49408-token BPE shipped in open_clip_torch (bpe_simple_vocab_16e6.txt.gz),
  as vocab.json + merges.txt. FLUX.1 and SD3's tokenizer pad with <|endoftext|>; SD3's
  tokenizer_2 (CLIP-G) pads with "!" (id 0): goldens are written for both.
* T5: a sentencepiece unigram model trained on a generated corpus (pad=0, eos=1, unk=2,
  100 extra ids as T5 has them).
* Mistral: a byte-level BPE tokenizer.json trained with `tokenizers` on the same corpus, with
  the Tekken split pattern and Mistral Small 3's special tokens and chat template.
"""
import gzip
import importlib.util
import json
import pathlib
import random
import shutil
import tempfile

CLIP_PAD_EOS = "<|endoftext|>"
CLIP_SMALL_MERGES = 2000  # the trimmed CLIP vocabulary of the tokenizer.json-form fixture
CLIP_PAD_BANG = "!"
T5_SPM_VOCAB = 1200
MISTRAL_VOCAB = 1500
MISTRAL_MAX_LENGTH = 512

# Mistral Small 3 (Tekken) special tokens, in id order.
MISTRAL_SPECIALS = [
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
    "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
] + [f"<SPECIAL_{i}>" for i in range(20, 32)]

# Tekken's pre-tokenizer pattern (letters with case runs, single digits, punctuation, spaces).
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The pattern the published Mistral Small 3.x tokenizer.json carries (Llama 3's); transformers
# keeps it unless loaded with fix_mistral_regex=True. Goldens cover both.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Mistral Small 3-style chat template: bos, system prompt block, [INST] user [/INST], assistant
# turns closed by eos. tessera hard-codes this structure (docs/decisions/0005-tokenizers.md).
MISTRAL_CHAT_TEMPLATE = (
    "{%- set default_system_message = 'You are a helpful assistant.' %}"
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- if messages[0]['content'] is string %}"
    "{%- set system_message = messages[0]['content'] %}"
    "{%- else %}"
    "{%- set system_message = messages[0]['content'][0]['text'] %}"
    "{%- endif %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set system_message = default_system_message %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if message['content'] is string %}"
    "{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- else %}"
    "{{- '[INST]' }}"
    "{%- for block in message['content'] %}"
    "{%- if block['type'] == 'text' %}{{- block['text'] }}"
    "{%- elif block['type'] in ['image', 'image_url'] %}{{- '[IMG]' }}"
    "{%- else %}{{- raise_exception('Only text and image blocks are supported') }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{{- '[/INST]' }}"
    "{%- endif %}"
    "{%- elif message['role'] == 'system' %}"
    "{%- if message['content'] is string %}"
    "{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- else %}"
    "{{- '[SYSTEM_PROMPT]' + message['content'][0]['text'] + '[/SYSTEM_PROMPT]' }}"
    "{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] + eos_token }}"
    "{%- else %}"
    "{{- message['content'][0]['text'] + eos_token }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- raise_exception('Only user, system and assistant roles are supported!') }}"
    "{%- endif %}"
    "{%- endfor %}"
)


def _write_json(path: pathlib.Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                    encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# CLIP
# ---------------------------------------------------------------------------------------------
def _bytes_to_unicode() -> dict:
    """GPT-2/CLIP byte -> printable code point table."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) +
            list(range(0xAE, 0xFF + 1)))
    # Insertion order matters: it is the order of the first 256 vocabulary ids.
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _open_clip_merges() -> list:
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("open_clip_torch is needed for the CLIP BPE: "
                           "pip install open_clip_torch --no-deps")
    gz = pathlib.Path(spec.submodule_search_locations[0]) / "bpe_simple_vocab_16e6.txt.gz"
    lines = gzip.open(gz).read().decode("utf-8").split("\n")
    # CLIP keeps the first 49152 - 256 - 2 merges (line 0 is the version header).
    return [tuple(line.split()) for line in lines[1:49152 - 256 - 2 + 1]]


def build_clip_tokenizer(dst: pathlib.Path, pad_token: str = CLIP_PAD_EOS) -> None:
    """Standard CLIPTokenizer folder with the real CLIP vocabulary (49408 tokens)."""
    dst = pathlib.Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    merges = _open_clip_merges()
    byte_chars = [_bytes_to_unicode()[b] for b in range(256)]
    # open_clip's order: bytes in bytes_to_unicode() insertion order, then with </w>.
    ordered = list(_bytes_to_unicode().values())
    vocab_list = ordered + [c + "</w>" for c in ordered] + ["".join(m) for m in merges]
    vocab_list += ["<|startoftext|>", "<|endoftext|>"]
    assert len(vocab_list) == 49408 and len(set(vocab_list)) == 49408, len(vocab_list)
    assert set(byte_chars) == set(ordered)
    vocab = {tok: i for i, tok in enumerate(vocab_list)}
    (dst / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (dst / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    special = {
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": pad_token, "unk_token": "<|endoftext|>",
    }
    _write_json(dst / "special_tokens_map.json", special)
    config = dict(special)
    config.update({
        "add_prefix_space": False, "clean_up_tokenization_spaces": True, "do_lower_case": True,
        "errors": "replace", "model_max_length": 77, "tokenizer_class": "CLIPTokenizer",
    })
    _write_json(dst / "tokenizer_config.json", config)


def _added_token(content: str) -> dict:
    # As the published CLIP tokenizer_config.json writes bos/eos/unk (normalized: true).
    return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True,
            "rstrip": False, "single_word": False}


def build_clip_small_tokenizer(dst: pathlib.Path) -> None:
    """vocab.json + merges.txt form of a trimmed CLIP BPE: the first CLIP_SMALL_MERGES merges of
    the real one (a prefix of a BPE's merges is a valid BPE), with the published CLIP config's
    layout (bos/eos/unk as AddedToken objects, normalized: true; pad a plain string)."""
    dst = pathlib.Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    merges = _open_clip_merges()[:CLIP_SMALL_MERGES]
    ordered = list(_bytes_to_unicode().values())
    vocab_list = ordered + [c + "</w>" for c in ordered] + ["".join(m) for m in merges]
    vocab_list += ["<|startoftext|>", "<|endoftext|>"]
    assert len(set(vocab_list)) == len(vocab_list)
    vocab = {tok: i for i, tok in enumerate(vocab_list)}
    (dst / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (dst / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    _write_json(dst / "tokenizer_config.json", {
        "add_prefix_space": False, "bos_token": _added_token("<|startoftext|>"),
        "do_lower_case": True, "eos_token": _added_token("<|endoftext|>"), "errors": "replace",
        "model_max_length": 77, "pad_token": "<|endoftext|>", "tokenizer_class": "CLIPTokenizer",
        "unk_token": _added_token("<|endoftext|>"),
    })


# ---------------------------------------------------------------------------------------------
# Shared training corpus (generated, deterministic)
# ---------------------------------------------------------------------------------------------
_WORDS = (
    "a an the of in on at with and or but to from by for over under near behind beside above "
    "cat dog bird horse fox owl whale dragon robot astronaut wizard knight child woman man girl "
    "boy city forest mountain river ocean lake desert island castle tower bridge street garden "
    "house room window door table chair lamp book painting portrait photo picture image scene "
    "red green blue yellow orange purple pink black white golden silver dark bright pale vivid "
    "small large tiny huge old young ancient modern futuristic cozy quiet busy misty sunny rainy "
    "snowy cloudy foggy stormy calm warm cold soft sharp smooth rough shiny matte glowing neon "
    "light shadow sunset sunrise night morning evening noon sky cloud star moon sun rain snow "
    "wind fire water stone wood metal glass paper cloth silk leather sand grass flower tree leaf "
    "detailed realistic cinematic dramatic volumetric lighting render rendered digital art oil "
    "watercolor sketch drawing illustration style highly intricate elegant beautiful stunning "
    "sits stands walks runs flies swims holds wears looks reads plays sleeps dances sings "
    "wearing holding reading playing sleeping dancing singing flying running walking looking "
    "is are was were be been has have had it its they them their there this that these those "
    "photograph camera lens bokeh focus depth field wide angle close up macro aerial view shot "
    "resolution quality masterpiece trending award winning professional studio natural soft "
    "you your we our i my me he she his her what where when why how which who not no yes "
    "structured responses object relationships attribution actions without speculation reasons "
    "about descriptions give focusing ai").split()
_ACCENTED = "café naïve résumé façade jalapeño über straße crème brûlée piñata smörgåsbord".split()
_OTHER = ("東京 日本 猫 犬 山 川 中文 字 한국어 서울 Москва привет мир Ελλάδα γεια שלום مرحبا "
          "नमस्ते ไทย").split()


def corpus_lines() -> list:
    """~12k deterministic sentences mixing words, case, numbers, punctuation and some unicode."""
    rng = random.Random(20261202)
    weights = [1.0 / (i + 1) ** 0.8 for i in range(len(_WORDS))]
    lines = []
    for n in range(12000):
        k = rng.randint(3, 18)
        words = rng.choices(_WORDS, weights=weights, k=k)
        for j in range(len(words)):
            r = rng.random()
            if r < 0.08:
                words[j] = words[j].capitalize()
            elif r < 0.10:
                words[j] = words[j].upper()
            elif r < 0.13:
                words[j] = str(rng.randint(0, 2026))
            elif r < 0.15:
                words[j] = rng.choice(_ACCENTED)
            elif r < 0.16:
                words[j] = rng.choice(_OTHER)
            elif r < 0.19:
                words[j] += rng.choice([",", ".", "!", "?", ";", ":", "'s", "'t", "-", ")"])
        line = " ".join(words)
        line = line[0].upper() + line[1:]
        if n % 7 == 0:
            line += "."
        lines.append(line)
    return lines


# ---------------------------------------------------------------------------------------------
# T5 (sentencepiece unigram)
# ---------------------------------------------------------------------------------------------
def _train_t5_spm(workdir: pathlib.Path) -> None:
    """Trains workdir/spiece.model; relative paths keep the temp dir out of the model's bytes."""
    import os

    import sentencepiece as spm

    (workdir / "corpus.txt").write_text("\n".join(corpus_lines()) + "\n", encoding="utf-8")
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        _spm_train(spm)
    finally:
        os.chdir(cwd)


def _spm_train(spm) -> None:
    spm.SentencePieceTrainer.train(
        input="corpus.txt", model_prefix="spiece", model_type="unigram",
        vocab_size=T5_SPM_VOCAB, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        character_coverage=0.9995, normalization_rule_name="nmt_nfkc", num_threads=1,
        input_sentence_size=0, shuffle_input_sentence=False, seed_sentencepiece_size=100000,
        max_sentencepiece_length=16, split_digits=False, byte_fallback=False,
        minloglevel=2)


def build_t5_tokenizer(dst: pathlib.Path) -> None:
    """T5 tokenizer folder: spiece.model (+ tokenizer.json, configs) loadable as T5TokenizerFast."""
    from transformers import T5TokenizerFast

    dst = pathlib.Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        _train_t5_spm(tmp)
        (tmp / "load").mkdir()
        shutil.copyfile(tmp / "spiece.model", tmp / "load" / "spiece.model")
        # from_pretrained on a folder with only spiece.model converts it to a tokenizers Unigram
        # (the constructor alone ignores the file in transformers 5).
        tok = T5TokenizerFast.from_pretrained(str(tmp / "load"), extra_ids=100,
                                              model_max_length=512)
        if len(tok) != T5_SPM_VOCAB + 100:
            raise RuntimeError(f"T5 tokenizer has {len(tok)} tokens, expected {T5_SPM_VOCAB + 100}")
        tok.save_pretrained(str(dst))
        # transformers 5 writes only tokenizer.json; T5 folders also ship spiece.model.
        shutil.copyfile(tmp / "spiece.model", dst / "spiece.model")


# ---------------------------------------------------------------------------------------------
# Mistral (byte-level BPE tokenizer.json)
# ---------------------------------------------------------------------------------------------
def build_mistral_tokenizer(dst: pathlib.Path, padding_side: str = "left") -> None:
    """Byte-level BPE tokenizer.json + tokenizer_config.json with a Mistral Small 3 chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    dst = pathlib.Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TEKKEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MISTRAL_VOCAB, min_frequency=2, special_tokens=MISTRAL_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_lines() + [_system_message()], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    tok.save(str(dst / "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    _write_json(dst / "special_tokens_map.json", special)
    config = dict(special)
    config.update({
        "chat_template": MISTRAL_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "model_max_length": 131072, "padding_side": padding_side,
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
    _write_json(dst / "tokenizer_config.json", config)


def _system_message() -> str:
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    return SYSTEM_MESSAGE


# ---------------------------------------------------------------------------------------------
# Golden strings
# ---------------------------------------------------------------------------------------------
def golden_strings() -> list:
    s = [
        "", " ", "   ", "\t", "\n", "\r\n", " \t \n ",
        "a", "A", "I", "hello", "Hello", "HELLO", "hello world", "Hello, World!",
        "a photo of a cat", "A photo of a cat.", "a photo of a cat ", " a photo of a cat",
        "a  photo   of    a cat", "a\tphoto\tof\ta\tcat", "a\nphoto\nof\na\ncat",
        "line one\n\nline two\r\n\r\nline three", "trailing tabs\t\t\t", "\n\nleading newlines",
        "A cat holding a sign that says hello world",
        "An astronaut riding a horse on the moon, highly detailed, 8k, trending on artstation",
        "a red fox in a snowy forest at sunset, cinematic lighting, volumetric fog",
        "it's", "It's a dog's life", "don't", "DON'T", "they're", "we've", "I'm", "you'll",
        "he'd", "it'S", "'s", "'t", "''s", "rock 'n' roll", "the cats' toys", "o'clock",
        "l'été", "isn't it?", "can't won't shouldn't", "y'all'd've",
        "café", "naïve", "résumé", "Crème Brûlée", "façade", "jalapeño", "über", "straße",
        "STRASSE", "smörgåsbord", "ÅNGSTRÖM", "e\u0301", "cafe\u0301", "n\u0303o",
        "A\u030a", "\u00c5", "\u212b", "ﬁne ﬂour", "Ǆ ǅ ǆ", "İstanbul", "ǰ", "ΣΊΣΥΦΟΣ",
        "Ⅻ", "①②③", "x²+y²=z²", "½ cup", "ℌ𝔢𝔩𝔩𝔬", "ｆｕｌｌｗｉｄｔｈ", "ﾊﾝｶｸ",
        "東京", "東京タワーの夜景", "猫が好きです。", "中文字符测试", "汉字和English混合",
        "한국어 텍스트", "서울의 밤", "Москва", "Привет, мир!", "Ελληνικά", "שלום עולם",
        "مرحبا بالعالم", "नमस्ते दुनिया", "ภาษาไทย", "Tiếng Việt có dấu",
        "😀", "🐱 cat", "a cat 🐱 and a dog 🐶", "👩‍👩‍👧‍👦", "🏳️‍🌈", "👍🏽", "❤️", "✨✨✨",
        "🇯🇵🇫🇷", "emoji at end 🚀", "⚡️ speed", "☃", "♥♦♣♠",
        "0", "7", "42", "123", "1234567890", "3.14159", "-273.15", "1,000,000", "1e10",
        "0x1F", "2026-12-02", "12:30pm", "$100", "€50", "£20", "¥1000", "100%", "#1",
        "4k 8k 16k", "v1.2.3", "f/1.8 50mm", "1/125s ISO 100", "A1B2C3", "x86_64",
        "!", "!!", "!!!", "?!", "...", "…", "---", "—", "–", "***", "@user", "#hashtag",
        "a.b.c", "e-mail", "well-known", "(parentheses)", "[brackets]", "{braces}",
        "<angle>", "\"quoted\"", "'single'", "“curly quotes”", "‘curly single’", "«guillemets»",
        "a/b\\c", "under_score", "back`tick", "tilde~", "caret^", "pipe|", "semi;colon",
        "colon:", "a&b", "a+b=c", "50% off!", "(((masterpiece)))", "[[cat]]",
        "&amp;", "&lt;b&gt;bold&lt;/b&gt;", "&quot;hi&quot;", "&#39;", "&nbsp;x", "<b>bold</b>",
        "<br/>", "Tom &amp; Jerry", "naÃ¯ve", "Ã©", "donâ€™t", "\u00a0nbsp\u00a0",
        "zero\u200bwidth", "soft\u00adhyphen", "bom\ufeffhere", "ideographic\u3000space",
        "em\u2003space", "line\u2028sep", "para\u2029sep", "ctrl\x07bell", "nul\x00byte",
        "tab\x0bvtab", "form\x0cfeed", "\x1c\x1d\x1e\x1f", "\x85nel", "del\x7f",
        "<|startoftext|>", "<|endoftext|>", "a <|endoftext|> b", "</s>", "<pad>", "<unk>",
        "<extra_id_0>", "<extra_id_99> end", "[INST]", "[/INST]", "[IMG] picture",
        "[SYSTEM_PROMPT]x[/SYSTEM_PROMPT]", "<s>", "<SPECIAL_20>",
        "ALL CAPS PROMPT", "camelCaseWord", "PascalCaseWord", "snake_case_word",
        "HTTPServerError", "iPhone", "McDonald's", "O'Neil", "DiCaprio",
        "supercalifragilisticexpialidocious", "pneumonoultramicroscopicsilicovolcanoconiosis",
        "https://example.com/path?q=1&r=2", "user@example.com", "C:\\Windows\\System32",
        "def f(x): return x**2", "for (int i = 0; i < n; ++i) {}", "SELECT * FROM t;",
        "a" * 300, "ab " * 120, "😀" * 60, "東" * 100,
        " ".join(["word"] * 100), "cat, " * 80, "1 2 3 4 5 6 7 8 9 " * 20,
    ]
    s.append(" ".join(corpus_lines()[:40]))  # ~400 words: well past 512 tokens
    s.append("\n".join(corpus_lines()[40:60]))
    rng = random.Random(7)
    pool = corpus_lines()[100:400]
    while len(s) < 220:
        s.append(rng.choice(pool) + rng.choice(["", " ", ".", "!", ", 8k", " 🎨", "  "]))
    seen, out = set(), []
    for x in s:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def random_unicode_strings(n: int = 300) -> list:
    """Seeded strings drawn across scripts, marks, digits and whitespace: they exercise the
    Unicode tables (classes, lowercase, NFC) more widely than the hand-picked strings."""
    rng = random.Random(1234)
    pools = [
        (0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
        (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x1E00, 0x1FFF),
        (0x2000, 0x206F), (0x2070, 0x218F), (0x2460, 0x24FF), (0x3000, 0x30FF),
        (0x4E00, 0x4FFF), (0xAC00, 0xD7A3), (0xFB00, 0xFB4F), (0xFF00, 0xFFEF),
        (0x1D400, 0x1D7FF), (0x1F300, 0x1F6FF), (0x10400, 0x1044F), (0x0, 0x1F),
    ]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(pools)
            chars.append(chr(rng.randint(lo, hi)))
            if rng.random() < 0.15:
                chars.append(" ")
        out.append("".join(chars))
    return out


def _encode(tok, texts, **kw) -> list:
    enc = tok(texts, **kw)
    return [{"ids": list(map(int, ids)), "mask": "".join(str(int(m)) for m in mask)}
            for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]


def _check_clip_against_open_clip(texts: list, folder: pathlib.Path) -> None:
    """open_clip's SimpleTokenizer, with ftfy stubbed out, must agree with transformers'."""
    import sys
    import types
    import unicodedata

    from transformers import CLIPTokenizer

    had_ftfy = "ftfy" in sys.modules
    if not had_ftfy:
        sys.modules["ftfy"] = types.SimpleNamespace(fix_text=lambda t: t)
    try:
        spec = importlib.util.find_spec("open_clip")
        path = pathlib.Path(spec.submodule_search_locations[0]) / "tokenizer.py"
        mod_spec = importlib.util.spec_from_file_location("_oc_tokenizer", path)
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
        oc = mod.SimpleTokenizer()
    finally:
        if not had_ftfy:
            del sys.modules["ftfy"]
    hf = CLIPTokenizer.from_pretrained(str(folder))
    mismatches, compared = [], 0
    for t in texts:
        a = hf(t, add_special_tokens=False)["input_ids"]
        # open_clip's cleaning (html.unescape, strip) differs by design; compare on the plain
        # ASCII-and-letters strings where both cleanings are the identity.
        if "&" in t or any(ord(c) < 32 for c in t) or "<|" in t:
            continue
        # ftfy.fix_text (which open_clip runs) NFC-normalises, as transformers' normaliser does;
        # transformers lowercases char by char (no final-sigma rule), Python's str.lower does not.
        b = oc.encode("".join(c.lower() for c in unicodedata.normalize("NFC", t)))
        compared += 1
        if a != b:
            mismatches.append((t, a, b))
    if mismatches:
        raise RuntimeError(f"open_clip and transformers' CLIPTokenizer differ on "
                           f"{len(mismatches)} strings, e.g. {mismatches[:3]!r}")
    print(f"[tokenizers] open_clip and transformers' CLIPTokenizer agree on {compared} strings")


def make(fixtures_dir: pathlib.Path) -> None:
    from transformers import AutoTokenizer, CLIPTokenizer, T5TokenizerFast

    out = pathlib.Path(fixtures_dir) / "tokenizers"
    if out.exists():
        shutil.rmtree(out)
    build_clip_tokenizer(out / "clip", pad_token=CLIP_PAD_EOS)
    build_t5_tokenizer(out / "t5")
    build_mistral_tokenizer(out / "mistral")

    texts = golden_strings()
    golden = {"strings": texts}

    clip_kw = dict(padding="max_length", max_length=77, truncation=True, return_tensors=None)
    # FLUX.1 / SD3 tokenizer pad with <|endoftext|>; SD3's tokenizer_2 folder differs only in
    # pad_token "!" (id 0), so that variant is the same folder with the pad token overridden.
    for name, pad in (("clip", CLIP_PAD_EOS), ("clip_pad_bang", CLIP_PAD_BANG)):
        tok = CLIPTokenizer.from_pretrained(str(out / "clip"), pad_token=pad)
        golden[name] = _encode(tok, texts, **clip_kw)
    _check_clip_against_open_clip(texts, out / "clip")

    t5 = T5TokenizerFast.from_pretrained(str(out / "t5"))
    for n in (77, 256, 512):
        golden[f"t5_{n}"] = _encode(t5, texts, padding="max_length", max_length=n,
                                   truncation=True, add_special_tokens=True)

    mistral = AutoTokenizer.from_pretrained(str(out / "mistral"))
    golden["mistral_plain"] = _encode(mistral, texts, add_special_tokens=True)
    # As Flux2Pipeline._get_mistral_3_small_prompt_embeds: format_input + apply_chat_template.
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input

    messages = format_input(prompts=texts, system_message=_system_message())
    enc = mistral.apply_chat_template(
        messages, add_generation_prompt=False, tokenize=True, return_dict=True,
        padding="max_length", truncation=True, max_length=MISTRAL_MAX_LENGTH)
    golden["mistral_chat_512"] = [
        {"ids": list(map(int, ids)), "mask": "".join(str(int(m)) for m in mask)}
        for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]
    golden["mistral_system_message"] = _system_message()
    # Unpadded ids without special tokens for the random strings (compact, tables stress test).
    rand = random_unicode_strings()
    golden["random_strings"] = rand
    clip = CLIPTokenizer.from_pretrained(str(out / "clip"))
    golden["random_clip"] = [clip(t, add_special_tokens=False)["input_ids"] for t in rand]
    golden["random_t5"] = [t5(t, add_special_tokens=False)["input_ids"] for t in rand]
    golden["random_mistral"] = [mistral(t, add_special_tokens=False)["input_ids"] for t in rand]
    # Same vocabulary with Llama 3's split pattern (what the published checkpoint carries); the
    # C++ test swaps the pattern in tokenizer.json the same way.
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    llama3 = Tokenizer.from_file(str(out / "mistral" / "tokenizer.json"))
    llama3.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    golden["mistral_llama3_pattern"] = LLAMA3_PATTERN
    golden["mistral_llama3_plain"] = [llama3.encode(t, add_special_tokens=False).ids
                                      for t in texts]
    golden["random_mistral_llama3"] = [llama3.encode(t, add_special_tokens=False).ids
                                       for t in rand]
    (out / "golden_ids.json").write_text(
        json.dumps(golden, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n",
        encoding="utf-8")
    make_json_forms(out, texts)


# ---------------------------------------------------------------------------------------------
# tokenizer.json folder forms (transformers 5's save_pretrained)
# ---------------------------------------------------------------------------------------------
def json_form_strings() -> list:
    """Prompts that tell file forms and pipeline components apart: empty, whitespace, "▁" (the
    Metaspace character) typed by the user, special-token text in other cases/widths (matched or
    not after normalisation), unknown characters, punctuation, numbers, long/truncated."""
    s = [
        "", " ", "  ", "\t\n", "a", "Hello  world", "  leading", "trailing  ", "tab\there",
        "new\nline", "\r\n\r\n", "mixed\u00a0\u2003\u3000spaces", "\ufeff", "zero\u200bwidth",
        "\u2581cat", "a\u2581b", "\u2581", "\u2581\u2581x", "cat\u2581", "\u2581 \u2581",
        "\uff1c/s\uff1e", "x</s>y", " </s> ", "</s></s>", "<pad><pad>", "<unk>", "\uff1cunk\uff1e",
        "<extra_id_0>x", "a <extra_id_99>b", "<extra_id_100>", "\u3000</s>",
        "<|startoftext|>", "<|STARTOFTEXT|> a", "<|startoftext|>a", "<|EndOfText|>",
        "a  <|endoftext|>b", "x<|endoftext|>y", "<|endoftext|><|endoftext|>", "<| endoftext |>",
        "\uff1c|endoftext|\uff1e", "<s>", "[INST]x[/INST]", "<SPECIAL_20>x", "[IMG][IMG]",
        "A\u0300\u0301", "\u01c5ungla", "\u0130", "\ufb03", "\u03a3\u038a\u03a3", "don't STOP", "'S 'T",
        "!!!", "hello!world", "\u00a1Hola!", "a, b; c: d.", "(((x)))", "\uff13.\uff11\uff14",
        "1234567890" * 3, "\u2177 \u2466 \u00b2", "3.14 -2 1e9", "emoji \U0001f469\u200d\U0001f469\u200d\U0001f467 ok",
        "\u6771\u4eac \ud55c\uad6d\uc5b4 \u041c\u043e\u0441\u043a\u0432\u0430", "\u0000nul\u0007",
        "a" * 120 + " b", "word " * 90,
    ]
    return s


COMPONENT_STRINGS = [
    "", " ", "  ", "the cat", "  the  and  ", "Then THE theme", "12-34--56", "a-b-c", "-", "--",
    "x1y22z333", "banana band", "caf\u00e9 \u00e9 e\u0301", "\u00fcnknown \u2603\u2603 chars",
    "<x> yes <x>yes yesno", "[MASK]  mask [MASK]x", "\u2581the", "tab\tthe\nend", "1",
    "the-12 and-34", "THE <X> and",
]


def build_component_tokenizers() -> dict:
    """Small tokenizer.json files (character BPE) exercising the components the CLIP, T5 and
    Mistral files do not: Strip, Prepend, Replace (string), Split behaviours and invert on
    string patterns, Digits, Metaspace variants, fuse_unk, Bert/Sequence post-processors and
    added tokens with lstrip/rstrip/single_word/normalized."""
    from tokenizers import AddedToken, Regex, Tokenizer, models
    from tokenizers import normalizers as N
    from tokenizers import pre_tokenizers as P
    from tokenizers import processors as R

    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2}
    for c in [chr(c) for c in range(0x20, 0x7F)] + ["\u2581", "\u00e9"]:
        vocab.setdefault(c, len(vocab))
    merges = [("t", "h"), ("th", "e"), ("h", "e"), ("\u2581", "t"), ("\u2581t", "he"), ("a", "n"),
              ("an", "d"), ("1", "2"), ("-", "-"), ("y", "e"), ("ye", "s")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    template = R.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                    special_tokens=[("[CLS]", 1), ("[SEP]", 2)])

    def make(fuse_unk=False, normalizer=None, pre=None, post=None):
        tok = Tokenizer(models.BPE(vocab=dict(vocab), merges=list(merges), unk_token="[UNK]",
                                   fuse_unk=fuse_unk))
        if normalizer is not None:
            tok.normalizer = normalizer
        if pre is not None:
            tok.pre_tokenizer = pre
        if post is not None:
            tok.post_processor = post
        tok.add_tokens([AddedToken("<x>", lstrip=True, normalized=True),
                        AddedToken("yes", single_word=True, normalized=False)])
        tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, rstrip=True)])
        return tok

    return {
        "strip_prepend": make(
            normalizer=N.Sequence([N.Strip(left=True, right=True), N.Replace("  ", " "),
                                   N.Prepend("\u2581"), N.Lowercase()]),
            pre=P.Split(" ", behavior="merged_with_previous"), post=template),
        "merged_next_digits": make(
            pre=P.Sequence([P.Split("-", behavior="merged_with_next"),
                            P.Digits(individual_digits=True)]),
            post=R.BertProcessing(("[SEP]", 2), ("[CLS]", 1))),
        "contiguous_digits": make(
            pre=P.Sequence([P.Split(" ", behavior="contiguous"), P.Digits(individual_digits=False)])),
        "inverted_removed_fuse_unk": make(
            fuse_unk=True, normalizer=N.NFC(),
            pre=P.Split("a", behavior="removed", invert=True)),
        "metaspace_never": make(
            normalizer=N.Replace(Regex(" {2,}"), "\u2581"),
            pre=P.Metaspace(replacement="\u2581", prepend_scheme="never", split=False),
            post=R.Sequence([R.ByteLevel(), template])),
        "whitespace_metaspace": make(
            pre=P.Sequence([P.WhitespaceSplit(),
                            P.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])),
        "isolated_string": make(pre=P.Split("the", behavior="isolated"), post=template),
    }


def make_json_forms(out: pathlib.Path, texts: list) -> None:
    """Folders as transformers 5's save_pretrained writes them, and ids from both file forms.

    * clip_small/ (vocab.json + merges.txt, published-style config) and clip_small_json/ (what
      save_pretrained writes from it: tokenizer.json + tokenizer_config.json);
    * t5_json/: the T5 tokenizer's save_pretrained output (tokenizer.json, no spiece.model);
    * components/<name>/tokenizer.json: small files for the other components
      (build_component_tokenizers);
    * golden_ids_json_form.json: ids (padded as the pipelines call) of golden_strings() +
      json_form_strings() for clip_small, of json_form_strings() for the full CLIP, T5 (77)
      and Mistral, and of COMPONENT_STRINGS (tokenizers' encode) for each component file. The
      CLIP and T5 columns are asserted equal across the file forms before they are written.
    """
    import tempfile

    from transformers import AutoTokenizer, CLIPTokenizer, T5TokenizerFast

    build_clip_small_tokenizer(out / "clip_small")
    CLIPTokenizer.from_pretrained(str(out / "clip_small")).save_pretrained(str(out / "clip_small_json"))
    T5TokenizerFast.from_pretrained(str(out / "t5")).save_pretrained(str(out / "t5_json"))
    for d in ("clip_small_json", "t5_json"):
        files = sorted(p.name for p in (out / d).iterdir())
        if files != ["tokenizer.json", "tokenizer_config.json"]:
            raise RuntimeError(f"save_pretrained wrote {files} in {d}")

    tricky = json_form_strings()
    small_texts = texts + [t for t in tricky if t not in set(texts)]
    clip_kw = dict(padding="max_length", max_length=77, truncation=True)
    golden = {"strings": tricky, "clip_small_strings": small_texts}

    def same(name, results):
        first = results[0]
        for r in results[1:]:
            if r != first:
                bad = [i for i, (a, b) in enumerate(zip(first, r)) if a != b][:3]
                raise RuntimeError(f"{name}: file forms disagree on strings {bad}")
        golden[name] = first

    same("clip_small", [_encode(CLIPTokenizer.from_pretrained(str(out / d)), small_texts, **clip_kw)
                        for d in ("clip_small", "clip_small_json")])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        CLIPTokenizer.from_pretrained(str(out / "clip")).save_pretrained(str(tmp / "clip_json"))
        same("clip", [_encode(CLIPTokenizer.from_pretrained(str(d)), tricky, **clip_kw)
                      for d in (out / "clip", tmp / "clip_json")])
        (tmp / "t5_spm").mkdir()
        shutil.copyfile(out / "t5" / "spiece.model", tmp / "t5_spm" / "spiece.model")
        same("t5_77", [_encode(T5TokenizerFast.from_pretrained(str(d)), tricky, padding="max_length",
                            max_length=77, truncation=True)
                       for d in (out / "t5", out / "t5_json", tmp / "t5_spm")])
    mistral = AutoTokenizer.from_pretrained(str(out / "mistral"))
    golden["mistral_plain"] = _encode(mistral, tricky, add_special_tokens=True)
    golden["component_strings"] = COMPONENT_STRINGS
    for name, tok in build_component_tokenizers().items():
        (out / "components" / name).mkdir(parents=True, exist_ok=True)
        tok.save(str(out / "components" / name / "tokenizer.json"))
        golden[f"component_{name}"] = [tok.encode(t).ids for t in COMPONENT_STRINGS]
    (out / "golden_ids_json_form.json").write_text(
        json.dumps(golden, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n",
        encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Unicode tables for the C++ tokenizers, probed from the `tokenizers` library itself so that
# tessera's classes, lowercasing and NFC are exactly the reference's; grapheme-cluster
# properties come from the `regex` package (run by hand:
#   /work/refvenv/bin/python reference/goldens/tokenizers.py --unicode-tables \
#       src/tokenizers/unicode_tables.inc)
# ---------------------------------------------------------------------------------------------
def _ranges(cps: list) -> list:
    out = []
    for c in cps:
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def write_unicode_tables(path: pathlib.Path) -> None:
    import unicodedata

    from tokenizers import Regex, normalizers, pre_tokenizers

    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(chr(c) for c in cps)

    def members(cls: str) -> list:
        pieces = pre_tokenizers.Split(Regex(f"[^{cls}]+"), behavior="removed").pre_tokenize_str(text)
        return [cps[i] for _, (b, e) in pieces for i in range(b, e)]

    classes = {"L": r"\p{L}", "Lu": r"\p{Lu}", "Ll": r"\p{Ll}", "Lt": r"\p{Lt}", "Lm": r"\p{Lm}",
               "Lo": r"\p{Lo}", "M": r"\p{M}", "N": r"\p{N}", "Space": r"\s"}
    lines = ["// Generated by reference/goldens/tokenizers.py --unicode-tables; do not edit.",
             "// Probed from the `tokenizers` library (its regex classes, Lowercase and NFC).", ""]
    for name, cls in classes.items():
        rs = _ranges(members(cls))
        lines.append(f"static const CpRange k{name}[] = {{")
        lines += [f"    {{0x{a:X}, 0x{b:X}}}," for a, b in rs]
        lines.append("};")
    low = normalizers.Lowercase()
    lines.append("static const LowerEntry kLower[] = {")
    for c in cps:
        lc = low.normalize_str(chr(c))
        if lc != chr(c):
            assert len(lc) <= 3, (hex(c), lc)
            vals = [ord(x) for x in lc] + [0] * (3 - len(lc))
            lines.append(f"    {{0x{c:X}, {{0x{vals[0]:X}, 0x{vals[1]:X}, 0x{vals[2]:X}}}}},")
    lines.append("};")
    nfd, nfc = normalizers.NFD(), normalizers.NFC()
    flat, decomp = [], []
    for c in cps:
        if 0xAC00 <= c <= 0xD7A3:
            continue  # Hangul syllables decompose algorithmically
        d = nfd.normalize_str(chr(c))
        if d != chr(c):
            decomp.append((c, len(flat), len(d)))
            flat += [ord(x) for x in d]
    lines.append("static const DecompEntry kDecomp[] = {")
    lines += [f"    {{0x{c:X}, {o}, {n}}}," for c, o, n in decomp]
    lines.append("};")
    lines.append("static const uint32_t kDecompData[] = {")
    for i in range(0, len(flat), 12):
        lines.append("    " + " ".join(f"0x{x:X}," for x in flat[i:i + 12]))
    lines.append("};")
    ccc = [(c, unicodedata.combining(chr(c))) for c in cps if unicodedata.combining(chr(c))]
    lines.append("static const CccRange kCcc[] = {")
    run = None
    for c, k in ccc:
        if run and run[1] == c - 1 and run[2] == k:
            run[1] = c
        else:
            if run:
                lines.append(f"    {{0x{run[0]:X}, 0x{run[1]:X}, {run[2]}}},")
            run = [c, c, k]
    lines.append(f"    {{0x{run[0]:X}, 0x{run[1]:X}, {run[2]}}},")
    lines.append("};")
    comps = []
    for c in cps:
        if 0xAC00 <= c <= 0xD7A3:
            continue
        raw = unicodedata.decomposition(chr(c))
        if not raw or raw.startswith("<"):
            continue
        parts = [int(x, 16) for x in raw.split()]
        if len(parts) == 2 and nfc.normalize_str(chr(parts[0]) + chr(parts[1])) == chr(c):
            comps.append((parts[0], parts[1], c))
    comps.sort()
    lines.append("static const CompEntry kComp[] = {")
    lines += [f"    {{0x{a:X}, 0x{b:X}, 0x{c:X}}}," for a, b, c in comps]
    lines.append("};")
    # Grapheme clusters (UAX #29) for the T5 charsmap, which transformers applies per cluster.
    import regex

    gcb_names = ["CR", "LF", "Control", "Extend", "ZWJ", "Regional_Indicator", "Prepend",
                 "SpacingMark", "L", "V", "T", "LV", "LVT"]
    gcb = {}
    for k, name in enumerate(gcb_names, start=1):
        pat = regex.compile(rf"\p{{Grapheme_Cluster_Break={name}}}")
        for c in cps:
            if pat.match(chr(c)):
                gcb[c] = k
    lines.append("// Grapheme_Cluster_Break: 1 CR, 2 LF, 3 Control, 4 Extend, 5 ZWJ, 6 RI, 7 Prepend,")
    lines.append("// 8 SpacingMark, 9 L, 10 V, 11 T, 12 LV, 13 LVT (absent: Other).")
    lines.append("static const CccRange kGcb[] = {")
    run = None
    for c in sorted(gcb):
        if run and run[1] == c - 1 and run[2] == gcb[c]:
            run[1] = c
        else:
            if run:
                lines.append(f"    {{0x{run[0]:X}, 0x{run[1]:X}, {run[2]}}},")
            run = [c, c, gcb[c]]
    lines.append(f"    {{0x{run[0]:X}, 0x{run[1]:X}, {run[2]}}},")
    lines.append("};")
    props = {"ExtPict": r"\p{Extended_Pictographic}", "InCBConsonant": r"\p{InCB=Consonant}",
             "InCBExtend": r"\p{InCB=Extend}", "InCBLinker": r"\p{InCB=Linker}"}
    for name, prop in props.items():
        pat = regex.compile(prop)
        rs = _ranges([c for c in cps if pat.match(chr(c))])
        lines.append(f"static const CpRange k{name}[] = {{")
        lines += [f"    {{0x{a:X}, 0x{b:X}}}," for a, b in rs]
        lines.append("};")
    pathlib.Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    import sys

    # This file's folder must not shadow the `tokenizers` package when run as a script.
    here = pathlib.Path(__file__).resolve().parent
    sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != here]
    if len(sys.argv) == 3 and sys.argv[1] == "--unicode-tables":
        write_unicode_tables(pathlib.Path(sys.argv[2]))
    else:
        print("usage: tokenizers.py --unicode-tables OUT.inc", file=sys.stderr)
        sys.exit(2)

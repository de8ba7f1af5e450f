"""Grammar-constrained decoding: constraints compiled once per distinct source
(`GrammarCache`), a matcher per request advanced with each sampled token
(`RequestMatcher`), and next-token bitmasks applied to the logits before sampling, under
overlap scheduling filled ahead on a helper thread (`MaskPrefetch`)."""

from .grammar import GrammarCache, GrammarError
from .mask import MaskFiller, ReadyMasks, apply_bitmask, fill_bitmask
from .matcher import RequestMatcher
from .prefetch import MaskPrefetch

__all__ = [
    "GrammarCache", "GrammarError", "MaskFiller", "MaskPrefetch", "ReadyMasks", "RequestMatcher",
    "apply_bitmask", "fill_bitmask",
]

"""Sentin8:Proxy's library. Importing it first settles which build of the hot modules runs (``native``)."""

from sentin8 import native as _native

BUILD = _native.guard()  # "compiled" or "pure": what the listed modules run as in this process

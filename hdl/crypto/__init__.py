"""Cryptographic gateware: SipHash-2-4 (``siphash.py``), the tag function of
``docs/protocol/network.md`` section 7."""

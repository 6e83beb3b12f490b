"""GPUFlex mesh: an embeddable peer-to-peer layer over py-libp2p.

Identity, Noise-only libp2p hosts, Kademlia discovery, signed envelopes, flood gossip,
peer health and content-addressed blob transfer. It never imports torch, so it can be
embedded in any trio program and tested with trio alone.
"""

__version__ = "0.1.0"

"""The ``gpuflex`` command line; one module per command group."""

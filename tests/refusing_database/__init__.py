"""A database backend whose server refuses every connection (down, or out of connection
slots), for workers the tests start with ``RCOORD_TEST_REFUSING_DATABASE=1``."""

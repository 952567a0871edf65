"""HTTP/2 client connections (ALPN ``h2``): ``H2Bridge`` (connection.py) drives the engine adapter
(``sentin8/http/h2_engine.py``); each stream (stream.py) is the ``Downstream`` of one ``Exchange``."""

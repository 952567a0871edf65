"""HTTP/1.1 client connections: ``L7Bridge`` (connection.py) is the ``Downstream`` of its request in flight."""

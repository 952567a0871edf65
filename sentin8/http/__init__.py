"""HTTP/1.1 request logic for the L7 bridge, sans-IO: framing checks, header hygiene, message builders."""

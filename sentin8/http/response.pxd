# C layout of response.py's shared framing records (Cython pure-Python mode; the .py stays the source).
cdef class ResponseFraming:
    cdef public bint chunked_out, close_client, close_delimited, drop_content_length
    cdef public object extra

cdef class UpstreamBody:
    cdef public bint chunked, drop_content_length, no_body, until_close

# C layout of response.py's shared framing records (Cython pure-Python mode; the .py stays the source).
cimport cython
cdef class ResponseFraming:
    cdef public bint chunked_out, close_client, close_delimited, drop_content_length
    cdef public object extra

cdef class UpstreamBody:
    cdef public bint chunked, drop_content_length, no_body, until_close

# the per-response functions the relay, the exchange and the h1 writer call (they cimport them): C calls
# name and value typed bytes (the response parser's): lower() and strip() are C calls, len() a struct read
@cython.locals(name=bytes, value=bytes, n=Py_ssize_t, chunked_in=bint, has_length=bint, no_body=bint,
               until_close=bint, bodies=list)
cpdef UpstreamBody upstream_body(status, list headers, bint head_only)
cpdef ResponseFraming client_framing(UpstreamBody body, version, bint keep_alive, bint websocket, bint draining)
cpdef bint status_line_acceptable(raw, Py_ssize_t index, Py_ssize_t status)
cpdef bint upstream_reusable(bint backend_keep_alive, bint extra_bytes, bint head_only, bint close_delimited, bint request_complete)
@cython.locals(size=Py_ssize_t, group=list, out=list)  # a piece may be a view (body slices): only the sizes typed
cpdef list coalesce(list pieces, Py_ssize_t limit)

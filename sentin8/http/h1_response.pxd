# C layout of the client half of one HTTP/1.1 response (Cython pure-Python mode; h1_response.py stays the
# source): the h1 writer holds it typed (writer.pxd), so a response's head and end are C calls, as are the
# framing functions they call.
from sentin8.http.framing cimport RequestHead  # the request head: its fields read as struct members
from sentin8.http.head_writer cimport response_head
from sentin8.http.response cimport UpstreamBody, client_framing

cdef class H1Response:
    cdef public object version
    cdef public bint chunked, close, continue_sent, head_only, keep_alive, websocket
    cpdef bytes head(self, status, reason, headers, UpstreamBody body, bint draining)
    cpdef end(self)
    cdef _take(self, RequestHead head)

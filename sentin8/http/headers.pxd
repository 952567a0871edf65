# C declarations for headers.py's per-request helpers (Cython pure-Python mode; headers.py stays the source):
# forward_headers calls each once per request, as C calls instead of through the Python call protocol.
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING
from sentin8.http.head_writer cimport _new_bytes
# out typed: its append is a C list append (a bound ``append`` local would be a Python call per header)
@cython.locals(name=bytes, low=bytes, norm=bytes, out=list)
cpdef tuple _filter_request(list headers, bint websocket, bint http10)
cpdef bytes correlation_id(object client_value)
cpdef bytes _uuid4()
@cython.locals(ids=bytes, dst=cython.p_char, src=cython.p_char, k=Py_ssize_t, j=int, b=int, at=int, digit=int,
               stride=Py_ssize_t, count=Py_ssize_t)
cdef bytes _formatted_ids(bytes random)
cpdef list _drop_listed(list out, list tokens)
cpdef tuple _route_context(route)
# per request, from the admission and the relay (they cimport them): C calls
# the str arguments typed: their encode() is a C call
cpdef tuple forward_headers(list headers, route, str client_ip, str proto, host, str hostname, bint websocket=*, client_cert=*, bint http10=*)
@cython.locals(name=bytes, low=bytes, out=list)
cpdef list response_headers(list headers, bint interim=*, bint upgrade=*)

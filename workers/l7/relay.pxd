# C layout of an exchange (Cython pure-Python mode; relay.py and exchange.py stay the source). Every field of
# Exchange is declared here, on its base, so both halves reach them as C struct members; all stay public
# (the connection, the stream and the tests read them).
from sentin8.http.framing cimport HeaderBudget
from sentin8.http.headers cimport response_headers
from sentin8.http.response cimport status_line_acceptable, upstream_body
from workers.l7.downstream cimport Downstream
from workers.l7.request cimport Request
from workers.upstream cimport UpstreamConn

cdef class ResponseRelay:
    cdef public Request req
    cdef public Downstream client  # the h1 connection or the h2 stream: its per-request calls are C calls
    cdef public object state, resp_headers, resp_parser, resp_reason, resp_raw, resp_trailers
    cdef public HeaderBudget resp_budget
    cdef public Py_ssize_t status, resp_body_bytes, interims, interim_bytes
    cdef public bint head_only, close_delimited, resp_extra, resp_keep_alive
    # Exchange's own fields (exchange.py), declared once with the rest
    cdef public object _candidates, _task, _waf, corr, head_bytes, host, instance, service
    cdef public UpstreamConn conn
    cdef public Py_ssize_t _cand_idx, body_written, sidx
    cdef public bint retried, warm
    # the calls an exchange makes on itself per request: C calls (Exchange overrides _to)
    cpdef _to(self, state)
    cpdef _reset_response(self)
    # httptools' callbacks, called by ResponseCallbacks (typed below): C calls
    cpdef on_message_begin(self)
    cpdef on_status(self, reason)
    cpdef on_header(self, name, value)
    cpdef on_headers_complete(self)
    cpdef on_body(self, body)
    cpdef on_message_complete(self)

cdef class ResponseCallbacks:
    cdef public ResponseRelay owner

cdef class ResponseParser:
    cdef public HeaderBudget budget
    cdef public ResponseCallbacks callbacks
    cdef public object parser
    cpdef lend(self, ResponseRelay owner)
    cpdef give_back(self, ResponseRelay owner)

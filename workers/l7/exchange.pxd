cimport cython
from sentin8.http.headers cimport response_headers
from sentin8.http.response cimport upstream_reusable
from workers.l7.relay cimport ResponseParser, ResponseRelay
from workers.l7.admission cimport Admitted, Refuse, admit
from workers.upstream cimport UpstreamConn
from workers.l7.contract cimport L7Context
from workers.waf_gate cimport WafGate

cdef class Exchange(ResponseRelay):
    # the steps of one request that call each other (relay.pxd has the rest): C calls
    @cython.locals(admitted=Admitted, refused=Refuse, gate=WafGate)
    cpdef begin(self)  # from the h1 connection's _start and the h2 stream's open, typed
    @cython.locals(mask="unsigned long long", bit=Py_ssize_t)
    cpdef _to(self, state)
    cpdef routed(self, service, sidx, host)
    @cython.locals(ctx=L7Context)
    cpdef forward(self)
    @cython.locals(parser=ResponseParser)
    cpdef _attach(self, UpstreamConn conn, inst, warm)
    cpdef _response_done(self)
    @cython.locals(parser=ResponseParser, conn=UpstreamConn, ctx=L7Context)
    @cython.locals(classes=dict)
    cpdef _finish(self, reuse, abort=*)

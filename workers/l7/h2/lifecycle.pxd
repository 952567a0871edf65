# C layout of an h2 client connection (Cython pure-Python mode; lifecycle.py and connection.py stay the source).
# ConnectionLifecycle is the first base of H2Bridge, so every field of the bridge is declared here, once, as a
# C struct member (as workers/l7/h1/reader.pxd does for the h1 bridge); all stay public. The engine and the
# budget are typed, so their cpdef methods are C calls from the bridge and from its streams. ``__dict__``
# keeps the class-level knobs (``external``, ``refuse_status``...) settable per instance.
from sentin8.http.h2_budget cimport StreamBudget
from sentin8.http.h2_engine cimport ServerConnection
from workers.l7.contract cimport L7Context

cdef class ConnectionLifecycle:
    cdef dict __dict__
    cdef public L7Context ctx
    cdef public object loop, client_addr, scheme, blocks, facts, transport, send_deadlines
    cdef public object _header_timer, _timer
    cdef public ServerConnection engine
    cdef public StreamBudget budget
    cdef public dict streams
    cdef public bint draining, _closing, _reading, _write_paused, _final_sent, _flush_soon
    cdef public Py_ssize_t _max_headers, _paused_streams, _lingered
    cdef public double _idle_timeout, _header_timeout, _drain_grace
    # what a stream calls on its connection (H2Bridge overrides them) and the timer's cancel, per stream: C calls
    cpdef stream_done(self, st)
    cpdef flush_soon(self)
    cpdef _cancel_timer(self)

# C declarations for framing.py's hot classes (Cython pure-Python mode; the .py stays the source).
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

cdef extern from *:
    """
    static inline int sentin8_occurs(PyObject *raw, PyObject *needle) {
        if (raw == Py_None) return 0;  /* a bytes-typed argument may be None: never read through it */
        return memmem(PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw),
                      PyBytes_AS_STRING(needle), (size_t)PyBytes_GET_SIZE(needle)) != NULL;
    }
    """
    bint _occurs "sentin8_occurs"(bytes raw, bytes needle)  # needle in raw, by memmem (request_line_is_http)

cdef extern from *:
    """
    static inline Py_ssize_t sentin8_find(PyObject *raw, PyObject *needle) {
        if (raw == Py_None) return -1;  /* a bytes-typed argument may be None: never read through it */
        const char *at = PyBytes_AS_STRING(raw);
        const char *hit = memmem(at, (size_t)PyBytes_GET_SIZE(raw),
                                 PyBytes_AS_STRING(needle), (size_t)PyBytes_GET_SIZE(needle));
        return hit == NULL ? -1 : (Py_ssize_t)(hit - at);
    }
    """
    Py_ssize_t _find "sentin8_find"(bytes raw, bytes needle)  # raw.find(needle), by memmem (a head's path)

cdef class HeaderBudget:
    cdef public Py_ssize_t count, max_count, max_size, size
    cpdef add(self, name, value)
    cpdef reset(self)

@cython.locals(size=Py_ssize_t)
cpdef HeaderBudget measured_budget(list headers)

cdef class RequestHead:
    cdef public object acme, authority, content_length, headers, host, method, path, target, version
    cdef public object websocket_key
    cdef public bint chunked, expect_continue, keep_alive, websocket
    # a .pxd cannot type __init__: the validators build heads through new_request_head, a C call to this
    @cython.locals(q=Py_ssize_t)  # target typed: its find() is a C call
    cdef _fill(self, method, bytes target, version, headers, host, authority, content_length, bint chunked,
               bint keep_alive, bint websocket, websocket_key, acme, bint expect_continue)

@cython.locals(head=RequestHead)
cpdef RequestHead new_request_head(method, target, version, headers, host, authority, content_length,
                                   bint chunked, bint keep_alive, bint websocket, websocket_key, acme,
                                   bint expect_continue)

# the per-request functions other compiled modules call (they cimport them): C calls, keyword arguments mapped
# at compile time (the .py keeps its keyword-only parameters)
# name and value typed bytes: their lower() and strip() are C calls, not methods looked up by name
@cython.locals(name=bytes, value=bytes, n=Py_ssize_t, target=bytes)  # target: its startswith is C (Cython's own)
cpdef RequestHead validate_request(method, bytes url, version, list headers, bint keep_alive, bint upgrade)
cpdef bint request_line_is_http(bytes raw, method, url)

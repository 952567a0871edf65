# C declarations for head_writer.py (Cython pure-Python mode; the .py stays the source): a head is sized, then
# copied into one uninitialised bytes object by C helpers; the per-request builders are cimported by the
# response and the admission as C calls.
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.tuple cimport PyTuple_GET_SIZE
from libc.string cimport memcpy

cdef extern from *:
    """
    static inline PyObject *sentin8_new_bytes(Py_ssize_t size) { return PyBytes_FromStringAndSize(NULL, size); }
    """
    bytes _new_bytes "sentin8_new_bytes"(Py_ssize_t size)  # a bytes object to fill (_head)

cpdef _add_fields(list parts, headers)  # per head: a C call from request_head and response_head
@cython.locals(reasons=dict, lines=dict)
cpdef bytes _status_line(status, reason)

# the per-request builders other compiled modules call (they cimport them): C calls
cpdef bytes request_head(method, target, headers, framing)
cpdef bytes response_head(status, reason, headers, extra=*)
cdef bytes _head(list lead, headers, extra)
@cython.locals(size=Py_ssize_t, sized=Py_ssize_t, at=cython.p_char, end=cython.p_char, head=bytes, piece=bytes)
cdef _head_in_one_copy(list lead, headers, extra)
@cython.locals(size=Py_ssize_t)
cdef Py_ssize_t _fields_size(fields)
# the copy pass's names typed bytes (the sizing pass has checked each object's type first)
@cython.locals(key=bytes, text=bytes)
cdef char *_put_fields(char *at, char *end, fields) except NULL
cdef char *_put(char *at, bytes data) noexcept

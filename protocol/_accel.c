/* protocol's C parts, each standing in for Python that every produced batch would otherwise pay for, each with a
 * pure-Python equivalent used where this module is not built (no C compiler at install).
 *
 * walk(data, start, count, last_offset_delta, from_client, keys) -> int | None
 *   The record walk of protocol/records.py: the framing of every record of a v2 batch, checked without building any
 *   object. It answers only what it is sure of: a sound batch (the greatest timestamp delta, as an int), or None for
 *   anything else (a framing error, a value beyond 64 bits, a header key the caller watches for), and the caller
 *   then walks the batch in Python, which raises the error with its message or hands the watched headers over. So
 *   the Python walk stays the definition, and tests/test_record_walk.py checks that this one never says "sound"
 *   where the Python walk would refuse, on random and damaged batches. Every read is bounded by the buffer's length.
 *   data: a contiguous buffer holding the records from `start` to its end; count: the batch's record count;
 *   from_client: offset deltas must be exactly 0..count-1 (else increasing and <= last_offset_delta);
 *   keys: None, or a tuple of bytes: header keys whose presence sends the batch back to the Python walk.
 *
 * uninitialized(size) -> bytearray
 *   A bytearray of `size` bytes that are not zeroed first (`bytearray(size)` zeroes them): for a buffer every byte of
 *   which is written before any is read (a request read from a socket).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define VARINT_MAX_BYTES 5
#define VARLONG_MAX_BYTES 10
#define MIN_RECORD_SIZE 7

/* One zigzag varint at *pos, at most max_bytes long; 0 on success, -1 if it runs past end, is too long, or (a
 * varlong) does not fit in 64 bits. */
static int read_long_varint(const uint8_t *p, Py_ssize_t *pos, Py_ssize_t end, int max_bytes, int64_t *out)
{
    Py_ssize_t i = *pos;
    uint64_t raw = 0;
    int shift = 0;
    for (int n = 0; n < max_bytes; n++, shift += 7) {
        if (i >= end)
            return -1;
        uint8_t b = p[i++];
        uint64_t bits = b & 0x7F;
        if (shift == 63 && bits > 1)
            return -1; /* beyond 64 bits: the Python walk decides */
        raw |= bits << shift;
        if (b < 0x80) {
            *pos = i;
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
    }
    return -1;
}

/* read_long_varint, with one- and two-byte varints (nearly every one: lengths below 8 KB, offset deltas) inline. */
static inline int read_varint(const uint8_t *p, Py_ssize_t *pos, Py_ssize_t end, int max_bytes, int64_t *out)
{
    Py_ssize_t i = *pos;
    if (i + 1 < end) {
        uint32_t raw = p[i];
        if (raw < 0x80) {
            *pos = i + 1;
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
        if (p[i + 1] < 0x80) {
            raw = (raw & 0x7F) | ((uint32_t)p[i + 1] << 7);
            *pos = i + 2;
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
    }
    return read_long_varint(p, pos, end, max_bytes, out);
}

/* A length (-1: null) and the bytes it counts, which must end within the record; 0 on success. */
static inline int skip_field(const uint8_t *p, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t record_end)
{
    int64_t v;
    if (read_varint(p, pos, end, VARINT_MAX_BYTES, &v) < 0 || v < -1 || v > record_end - *pos)
        return -1;
    if (v > 0)
        *pos += (Py_ssize_t)v;
    return 0;
}

/* Whether key p[0:len] is one of `keys` (a tuple of bytes). */
static int watched(const uint8_t *p, Py_ssize_t len, PyObject *keys)
{
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *key = PyTuple_GET_ITEM(keys, k);
        if (PyBytes_GET_SIZE(key) == len && memcmp(PyBytes_AS_STRING(key), p, (size_t)len) == 0)
            return 1;
    }
    return 0;
}

/* 0: sound, with *max_ts_delta set; -1: not (or not sure). */
static int walk_records(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end, long long count, long long last_delta,
                        int from_client, PyObject *keys, int64_t *max_ts_delta)
{
    int64_t max_ts = INT64_MIN;
    int64_t previous_delta = -1;
    int64_t v;
    for (long long index = 0; index < count; index++) {
        if (read_varint(p, &pos, end, VARINT_MAX_BYTES, &v) < 0)
            return -1;
        if (v < MIN_RECORD_SIZE - 1 || v > end - pos)
            return -1;
        Py_ssize_t record_end = pos + (Py_ssize_t)v;
        pos += 1; /* attributes */
        if (read_varint(p, &pos, end, VARLONG_MAX_BYTES, &v) < 0)
            return -1;
        if (v > max_ts)
            max_ts = v;
        if (read_varint(p, &pos, end, VARINT_MAX_BYTES, &v) < 0)
            return -1;
        if (from_client) {
            if (v != index)
                return -1;
        } else if (v <= previous_delta || v > last_delta) {
            return -1;
        }
        previous_delta = v;
        if (skip_field(p, &pos, end, record_end) < 0 || skip_field(p, &pos, end, record_end) < 0) /* key, value */
            return -1;
        int64_t headers;
        if (read_varint(p, &pos, end, VARINT_MAX_BYTES, &headers) < 0)
            return -1;
        if (headers < 0 || headers > (record_end - pos) / 2)
            return -1;
        for (int64_t h = 0; h < headers; h++) {
            if (read_varint(p, &pos, end, VARINT_MAX_BYTES, &v) < 0)
                return -1;
            if (v < 0 || v > record_end - pos)
                return -1;
            if (keys != NULL && watched(p + pos, (Py_ssize_t)v, keys))
                return -1;
            pos += (Py_ssize_t)v;
            if (skip_field(p, &pos, end, record_end) < 0) /* the header's value */
                return -1;
        }
        if (pos != record_end)
            return -1;
    }
    if (pos != end)
        return -1;
    *max_ts_delta = max_ts;
    return 0;
}

static PyObject *walk(PyObject *module, PyObject *args)
{
    Py_buffer data;
    Py_ssize_t start;
    long long count, last_delta;
    int from_client;
    PyObject *keys;
    if (!PyArg_ParseTuple(args, "y*nLLpO", &data, &start, &count, &last_delta, &from_client, &keys))
        return NULL;
    if (keys == Py_None) {
        keys = NULL;
    } else if (!PyTuple_Check(keys)) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_TypeError, "keys must be None or a tuple of bytes");
        return NULL;
    } else {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++) {
            if (!PyBytes_CheckExact(PyTuple_GET_ITEM(keys, k))) {
                PyBuffer_Release(&data);
                PyErr_SetString(PyExc_TypeError, "keys must be None or a tuple of bytes");
                return NULL;
            }
        }
    }
    int64_t max_ts_delta = 0;
    int sound = start >= 0 && start <= data.len && count > 0 &&
                walk_records((const uint8_t *)data.buf, start, data.len, count, last_delta, from_client, keys,
                             &max_ts_delta) == 0;
    PyBuffer_Release(&data);
    if (!sound)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(max_ts_delta);
}

static PyObject *uninitialized(PyObject *module, PyObject *arg)
{
    Py_ssize_t size = PyLong_AsSsize_t(arg);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "negative size");
        return NULL;
    }
    return PyByteArray_FromStringAndSize(NULL, size);
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(data, start, count, last_offset_delta, from_client, keys) -> greatest timestamp delta, or None"},
    {"uninitialized", uninitialized, METH_O, "uninitialized(size) -> a bytearray of size bytes, not zeroed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "protocol._accel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__accel(void) { return PyModule_Create(&module); }

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
 * walk_watched(data, start, count, last_offset_delta, from_client, keys) -> int | tuple | None
 *   The same walk, for a caller that reads the watched headers (keys: a tuple of 1 to 8 bytes): a sound batch none
 *   of whose headers is watched gives its greatest timestamp delta, as walk does; a sound batch where each record
 *   that holds any watched key holds each of them exactly once, with a value that is not null, gives
 *   (greatest timestamp delta, [index of each such record], ([value of key 0 per such record], ...)) with the
 *   values as bytes (a value equal to the record before's is the same object: a producer's name is read once);
 *   anything else None, for the Python walk (protocol/sequence_headers.py's scan), which has the last word on a key
 *   missing, twice or null. tests/test_record_walk.py checks that both read the same on random batches.
 *
 * walk_watched(data, start, count, last_offset_delta, from_client, keys, runs=True) -> ... | tuple of 4
 *   With runs (keys: exactly 2), a producer's usual batch is handed over without an object per record: when every
 *   record holds both keys once, key 0 with the same value throughout and key 1 a decimal of 1 to 18 ASCII digits
 *   each one above the record before's, (greatest timestamp delta, key 0's value, first id, last id); any other
 *   batch gets walk_watched's answer (walked again from its start, collecting, once it is seen not to be a run). Its
 *   Python twin is protocol/sequence_headers.py's `consecutive_run`, over what the Python walk collects.
 *
 * decimal_ids(values) -> (list[int], bool) | None
 *   protocol/sequence_headers.py's reading of a batch's kop.sequence.id values (a list of bytes): when each is 1 to 18
 *   ASCII digits (so within int64), their ints and whether they rise strictly; else None, and the Python code checks
 *   them one by one for the error message. Its Python twin (`_decimal_ids`) gives the same; tests compare them.
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

/* Which of `keys` (a tuple of bytes) key p[0:len] is, or -1. */
static int watched_index(const uint8_t *p, Py_ssize_t len, PyObject *keys)
{
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *key = PyTuple_GET_ITEM(keys, k);
        if (PyBytes_GET_SIZE(key) == len && memcmp(PyBytes_AS_STRING(key), p, (size_t)len) == 0)
            return (int)k;
    }
    return -1;
}

#define MAX_COLLECTED_KEYS 8

#define SURE_DIGITS 18 /* an id of at most this many digits is within int64 */

/* A producer's usual batch as walk_watched's runs read it: every record key 0's same value, key 1 consecutive ids. */
typedef struct {
    const uint8_t *name; /* record 0's value of key 0, in the buffer */
    Py_ssize_t name_len;
    int64_t first, last;
} Run;

/* What walk_watched collects: the indexes of the records holding the watched keys, and each key's values; or, while
 * `run` is set, only the run they make (nothing per record). */
typedef struct {
    Py_ssize_t keys;
    PyObject *indexes;                    /* list of int */
    PyObject *values[MAX_COLLECTED_KEYS]; /* lists of bytes */
    int run;                              /* reading a run: keys == 2 */
    Run read;
} Collected;

/* p[0:len] as 1 to SURE_DIGITS ASCII digits, into *out; 0, or -1 when it is not that. */
static int read_decimal(const uint8_t *p, Py_ssize_t len, int64_t *out)
{
    if (len < 1 || len > SURE_DIGITS)
        return -1;
    int64_t id = 0;
    for (Py_ssize_t d = 0; d < len; d++) {
        if (p[d] < '0' || p[d] > '9')
            return -1;
        id = id * 10 + (p[d] - '0');
    }
    *out = id;
    return 0;
}

/* Record `index` (holding both keys: name, id) continues the run; 0, or -1 when it does not. */
static int extend_run(Run *run, long long index, const uint8_t *name, Py_ssize_t name_len, const uint8_t *id,
                      Py_ssize_t id_len)
{
    int64_t value;
    if (read_decimal(id, id_len, &value) < 0)
        return -1;
    if (index == 0) {
        run->name = name;
        run->name_len = name_len;
        run->first = value;
    } else if (name_len != run->name_len || memcmp(name, run->name, (size_t)name_len) != 0 || value != run->last + 1) {
        return -1;
    }
    run->last = value;
    return 0;
}

/* Append `value` (p[0:len]) to `list`, reusing the list's last item when it holds the same bytes; 0 or -2. */
static int append_value(PyObject *list, const uint8_t *p, Py_ssize_t len)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n > 0) {
        PyObject *last = PyList_GET_ITEM(list, n - 1);
        if (PyBytes_GET_SIZE(last) == len && memcmp(PyBytes_AS_STRING(last), p, (size_t)len) == 0)
            return PyList_Append(list, last) < 0 ? -2 : 0;
    }
    PyObject *value = PyBytes_FromStringAndSize((const char *)p, len);
    if (value == NULL)
        return -2;
    int rc = PyList_Append(list, value);
    Py_DECREF(value);
    return rc < 0 ? -2 : 0;
}

/* 0: sound, with *max_ts_delta set; -1: not (or not sure); -2: a Python exception (out of memory) is set; -3: (with
 * collected->run) not a run, so far as walked.
 * collected: NULL to give up (-1) at a watched key; else each record's watched values are appended to it, or while
 * collected->run is set the run they make is read (collected->read). */
static int walk_records(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end, long long count, long long last_delta,
                        int from_client, PyObject *keys, Collected *collected, int64_t *max_ts_delta)
{
    const uint8_t *found[MAX_COLLECTED_KEYS];
    Py_ssize_t found_len[MAX_COLLECTED_KEYS];
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
        int any_found = 0;
        if (collected != NULL)
            memset(found, 0, sizeof(found));
        for (int64_t h = 0; h < headers; h++) {
            if (read_varint(p, &pos, end, VARINT_MAX_BYTES, &v) < 0)
                return -1;
            if (v < 0 || v > record_end - pos)
                return -1;
            int k = -1;
            if (keys != NULL) {
                k = watched_index(p + pos, (Py_ssize_t)v, keys);
                if (k >= 0 && (collected == NULL || found[k] != NULL))
                    return -1; /* watched, or a watched key twice: the Python walk decides */
            }
            pos += (Py_ssize_t)v;
            if (k < 0) {
                if (skip_field(p, &pos, end, record_end) < 0) /* the header's value */
                    return -1;
                continue;
            }
            if (read_varint(p, &pos, end, VARINT_MAX_BYTES, &v) < 0 || v < 0 || v > record_end - pos)
                return -1; /* a null value (or bad framing): the Python walk decides */
            found[k] = p + pos;
            found_len[k] = (Py_ssize_t)v;
            any_found = 1;
            pos += (Py_ssize_t)v;
        }
        if (pos != record_end)
            return -1;
        if (collected != NULL && collected->run) {
            if (!any_found)
                return -3; /* a record without them */
            if (found[0] == NULL || found[1] == NULL)
                return -1; /* a watched key missing: the Python walk decides */
            if (extend_run(&collected->read, index, found[0], found_len[0], found[1], found_len[1]) < 0)
                return -3;
        } else if (any_found) {
            for (Py_ssize_t k = 0; k < collected->keys; k++)
                if (found[k] == NULL)
                    return -1; /* a watched key missing: the Python walk decides */
            PyObject *i = PyLong_FromLongLong(index);
            if (i == NULL)
                return -2;
            int rc = PyList_Append(collected->indexes, i);
            Py_DECREF(i);
            if (rc < 0)
                return -2;
            for (Py_ssize_t k = 0; k < collected->keys; k++)
                if (append_value(collected->values[k], found[k], found_len[k]) < 0)
                    return -2;
        }
    }
    if (pos != end)
        return -1;
    *max_ts_delta = max_ts;
    return 0;
}

/* The arguments of walk and walk_watched. */
typedef struct {
    Py_buffer data;
    Py_ssize_t start;
    long long count, last_delta;
    int from_client;
    PyObject *keys; /* NULL: none watched */
} WalkArgs;

/* Parse (data, start, count, last_offset_delta, from_client, keys) and, with `runs`, an optional flag into it; keys: a
 * tuple of bytes, of 1 to `most` (or None and the empty tuple when `none_allowed`). 0, or -1 with an exception set
 * and nothing held. */
static int parse_walk_args(PyObject *args, WalkArgs *a, Py_ssize_t most, int none_allowed, const char *message,
                           int *runs)
{
    int parsed = runs == NULL ? PyArg_ParseTuple(args, "y*nLLpO", &a->data, &a->start, &a->count, &a->last_delta,
                                                 &a->from_client, &a->keys)
                              : PyArg_ParseTuple(args, "y*nLLpO|p", &a->data, &a->start, &a->count, &a->last_delta,
                                                 &a->from_client, &a->keys, runs);
    if (!parsed)
        return -1;
    PyObject *keys = a->keys;
    int ok = PyTuple_Check(keys) && PyTuple_GET_SIZE(keys) <= most && (none_allowed || PyTuple_GET_SIZE(keys) > 0);
    for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(keys); k++)
        ok = PyBytes_CheckExact(PyTuple_GET_ITEM(keys, k));
    if (none_allowed && (keys == Py_None || (ok && PyTuple_GET_SIZE(keys) == 0))) {
        a->keys = NULL;
        return 0;
    }
    if (ok)
        return 0;
    PyBuffer_Release(&a->data);
    PyErr_SetString(PyExc_TypeError, message);
    return -1;
}

/* walk_records over parsed arguments: -1 for a start outside the buffer or no records. */
static int walk_parsed(WalkArgs *a, Collected *collected, int64_t *max_ts_delta)
{
    if (a->start < 0 || a->start > a->data.len || a->count <= 0)
        return -1;
    return walk_records((const uint8_t *)a->data.buf, a->start, a->data.len, a->count, a->last_delta, a->from_client,
                        a->keys, collected, max_ts_delta);
}

static PyObject *walk(PyObject *module, PyObject *args)
{
    WalkArgs a;
    if (parse_walk_args(args, &a, PY_SSIZE_T_MAX, 1, "keys must be None or a tuple of bytes", NULL) < 0)
        return NULL;
    int64_t max_ts_delta = 0;
    int sound = walk_parsed(&a, NULL, &max_ts_delta) == 0;
    PyBuffer_Release(&a.data);
    if (!sound)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(max_ts_delta);
}

static PyObject *walk_watched(PyObject *module, PyObject *args)
{
    WalkArgs a;
    int runs = 0;
    if (parse_walk_args(args, &a, MAX_COLLECTED_KEYS, 0, "keys must be a tuple of 1 to 8 bytes", &runs) < 0)
        return NULL;
    if (runs && PyTuple_GET_SIZE(a.keys) != 2) {
        PyBuffer_Release(&a.data);
        PyErr_SetString(PyExc_TypeError, "runs need exactly 2 keys: the name's and the id's");
        return NULL;
    }
    Collected collected = {PyTuple_GET_SIZE(a.keys), PyList_New(0), {NULL}, runs, {NULL, 0, 0, 0}};
    PyObject *result = NULL;
    int rc = -2;
    if (collected.indexes == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < collected.keys; k++)
        if ((collected.values[k] = PyList_New(0)) == NULL)
            goto done;
    int64_t max_ts_delta = 0;
    rc = walk_parsed(&a, &collected, &max_ts_delta);
    if (rc == -3) { /* not a run: collect, from the start (nothing was collected so far) */
        collected.run = 0;
        rc = walk_parsed(&a, &collected, &max_ts_delta);
    }
    if (rc == -1) {
        result = Py_NewRef(Py_None);
    } else if (rc == 0 && collected.run) {
        result = Py_BuildValue("(Ly#LL)", (long long)max_ts_delta, (const char *)collected.read.name,
                               collected.read.name_len, (long long)collected.read.first, (long long)collected.read.last);
    } else if (rc == 0 && PyList_GET_SIZE(collected.indexes) == 0) {
        result = PyLong_FromLongLong(max_ts_delta);
    } else if (rc == 0) {
        PyObject *values = PyTuple_New(collected.keys);
        if (values != NULL) {
            for (Py_ssize_t k = 0; k < collected.keys; k++)
                PyTuple_SET_ITEM(values, k, Py_NewRef(collected.values[k]));
            result = Py_BuildValue("(LON)", (long long)max_ts_delta, collected.indexes, values);
        }
    }
done:
    PyBuffer_Release(&a.data);
    Py_XDECREF(collected.indexes);
    for (Py_ssize_t k = 0; k < MAX_COLLECTED_KEYS; k++)
        Py_XDECREF(collected.values[k]);
    return result;
}

static PyObject *decimal_ids(PyObject *module, PyObject *values)
{
    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "values must be a list of bytes");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    PyObject *ids = PyList_New(n);
    if (ids == NULL)
        return NULL;
    int rising = 1;
    int64_t previous = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyList_GET_ITEM(values, i);
        if (!PyBytes_CheckExact(value)) {
            Py_DECREF(ids);
            PyErr_SetString(PyExc_TypeError, "values must be a list of bytes");
            return NULL;
        }
        int64_t id;
        if (read_decimal((const uint8_t *)PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value), &id) < 0) {
            Py_DECREF(ids);
            Py_RETURN_NONE;
        }
        if (id <= previous)
            rising = 0;
        previous = id;
        PyObject *item = PyLong_FromLongLong(id);
        if (item == NULL) {
            Py_DECREF(ids);
            return NULL;
        }
        PyList_SET_ITEM(ids, i, item);
    }
    return Py_BuildValue("(NO)", ids, rising ? Py_True : Py_False);
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
    {"walk_watched", walk_watched, METH_VARARGS,
     "walk_watched(data, start, count, last_offset_delta, from_client, keys, runs=False) -> greatest timestamp "
     "delta, (it, indexes, values per key), (it, key 0's value, first id, last id) for a run, or None"},
    {"decimal_ids", decimal_ids, METH_O, "decimal_ids(values) -> (ids, strictly rising), or None"},
    {"uninitialized", uninitialized, METH_O, "uninitialized(size) -> a bytearray of size bytes, not zeroed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "protocol._accel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__accel(void) { return PyModule_Create(&module); }

/* streamrt._viewcache: the hit path of KernelContext.array in C (kernel.py).
 *
 * A kernel body asks for its views with ctx.array(ptr, shape, dtype, readonly=...) on every
 * run; in CPython the call of a Python method alone costs about as much as the np.add of a
 * tiny kernel. ViewCache is KernelContext's base: it holds the two fields the hit path reads
 * (_last: the device's dict ptr -> (shape, dtype, writable view, read-only view) of the views
 * made last; _view: the device's view function, the miss path) and answers a hit here. The
 * semantics are kernel.PyViews.array's, which is the fallback for everything else: a call of
 * another shape (keywords other than readonly, a count of positional arguments other than 3)
 * goes to it whole, a miss to _view(ptr, shape, dtype, readonly), as there.
 *
 * Built by pip when a C compiler and the Python headers are there (pyproject.toml:
 * optional); without it, kernel.py uses PyViews (the same behaviour, slower).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *last; /* dict: ptr -> (shape, dtype, writable view or None, read-only view or None) */
    PyObject *view; /* callable(ptr, shape, dtype, readonly): makes (and caches) a view */
} ViewCache;

/* Process-wide, not module state: the hit path reads them on every call, and a lookup of the
 * module state from a subclass's instance would cost what this file saves. So one interpreter
 * (no subinterpreter imports it apart; 3.11 declares nothing), and both live to the end. */
static PyObject *readonly_str; /* "readonly", interned */
static PyObject *fallback;     /* views.PyViews.array: every call this file does not answer */

static PyObject *
call_fallback(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "streamrt._viewcache: no fallback set");
        return NULL;
    }
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    Py_ssize_t n = 1 + nargs + nkw;
    PyObject *small[8];
    PyObject **all = n <= 8 ? small : PyMem_Malloc(n * sizeof(PyObject *));
    if (all == NULL)
        return PyErr_NoMemory();
    all[0] = self;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++)
        all[i + 1] = args[i];
    PyObject *fn = Py_NewRef(fallback); /* held: the call may set another */
    PyObject *r = PyObject_Vectorcall(fn, all, 1 + nargs, kwnames);
    Py_DECREF(fn);
    if (all != small)
        PyMem_Free(all);
    return r;
}

/* ``a == b`` as Python answers it. PyObject_RichCompareBool is that but for its identity
 * shortcut, which gives what == gives for an exact tuple (it compares its items so) or int;
 * any other object's __eq__ runs, even against itself. */
static int
python_eq(PyObject *a, PyObject *b)
{
    if (a != b || PyTuple_CheckExact(a) || PyLong_CheckExact(a))
        return PyObject_RichCompareBool(a, b, Py_EQ);
    PyObject *r = PyObject_RichCompare(a, b, Py_EQ);
    if (r == NULL)
        return -1;
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

/* Invariant: Python code may run at every step below (a pointer's __hash__/__eq__ in the dict
 * lookup, a shape's __eq__, a readonly's __bool__) and may change this context's fields or
 * drop the dict and the entry; so the dict and the entry are held while used, and _view is
 * read (and held) only when called, after all of it, as PyViews.array reads it. */
static PyObject *
viewcache_array(ViewCache *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *readonly = Py_False;
    if (nargs != 3)
        return call_fallback((PyObject *)self, args, nargs, kwnames);
    if (kwnames != NULL) {
        /* only the exact keyword: anything else (a str subclass included) as Python binds it */
        PyObject *k = PyTuple_GET_SIZE(kwnames) == 1 ? PyTuple_GET_ITEM(kwnames, 0) : NULL;
        if (k == NULL || !PyUnicode_CheckExact(k) ||
            (k != readonly_str && PyUnicode_Compare(k, readonly_str) != 0)) {
            if (PyErr_Occurred())
                return NULL;
            return call_fallback((PyObject *)self, args, nargs, kwnames);
        }
        readonly = args[3];
    }
    PyObject *ptr = args[0], *shape = args[1], *dtype = args[2];
    PyObject *last = self->last;
    /* a plain dict only: a subclass's __missing__ or another mapping is the Python path's */
    if (last == NULL || !PyDict_CheckExact(last))
        return call_fallback((PyObject *)self, args, nargs, kwnames);
    /* as PyViews.array: the view last made at this address by this device, if it matches */
    Py_INCREF(last);
    PyObject *e = PyDict_GetItemWithError(last, ptr);
    Py_XINCREF(e);
    Py_DECREF(last);
    if (e == NULL) {
        if (PyErr_Occurred()) { /* (KeyError, TypeError): a miss, as in PyViews.array */
            if (!PyErr_ExceptionMatches(PyExc_KeyError) &&
                !PyErr_ExceptionMatches(PyExc_TypeError))
                return NULL;
            PyErr_Clear();
        }
    }
    else if (PyTuple_CheckExact(e) && PyTuple_GET_SIZE(e) == 4) {
        /* ``e[0] == shape and e[1] is dtype`` (in that order: the comparison may raise) */
        int eq = python_eq(PyTuple_GET_ITEM(e, 0), shape);
        if (eq > 0 && PyTuple_GET_ITEM(e, 1) == dtype) {
            int ro = PyObject_IsTrue(readonly);
            if (ro < 0) {
                Py_DECREF(e);
                return NULL;
            }
            PyObject *v = PyTuple_GET_ITEM(e, ro ? 3 : 2);
            if (v != Py_None) {
                Py_INCREF(v);
                Py_DECREF(e);
                return v;
            }
        }
        Py_DECREF(e);
        if (eq < 0)
            return NULL;
    }
    else { /* not the entry this file knows: the Python path decides */
        Py_DECREF(e);
        return call_fallback((PyObject *)self, args, nargs, kwnames);
    }
    PyObject *view = self->view;
    if (view == NULL) { /* (deleted, maybe by the code above): as the attribute read raises */
        PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '_view'",
                     Py_TYPE(self)->tp_name);
        return NULL;
    }
    Py_INCREF(view); /* held: the call may replace the field */
    PyObject *vargs[4] = {ptr, shape, dtype, readonly};
    PyObject *r = PyObject_Vectorcall(view, vargs, 4, NULL);
    Py_DECREF(view);
    return r;
}

static PyObject *
set_fallback(PyObject *module, PyObject *fn)
{
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "set_fallback needs a callable");
        return NULL;
    }
    Py_XSETREF(fallback, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyMethodDef viewcache_methods[] = {
    {"array", (PyCFunction)(void (*)(void))viewcache_array, METH_FASTCALL | METH_KEYWORDS,
     "A numpy view of device memory; read-only views declare a read, writable ones a write."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef viewcache_members[] = {
    {"_last", T_OBJECT_EX, offsetof(ViewCache, last), 0, "the device's views made last"},
    {"_view", T_OBJECT_EX, offsetof(ViewCache, view), 0, "the device's view function"},
    {NULL, 0, 0, 0, NULL},
};

static int
viewcache_traverse(ViewCache *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self)); /* a heap type's instances refer to it */
    Py_VISIT(self->last);
    Py_VISIT(self->view);
    return 0;
}

static int
viewcache_clear(ViewCache *self)
{
    Py_CLEAR(self->last);
    Py_CLEAR(self->view);
    return 0;
}

static void
viewcache_dealloc(ViewCache *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    viewcache_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyType_Slot viewcache_slots[] = {
    {Py_tp_doc, "KernelContext's base: the fields and the hit path of its array()."},
    {Py_tp_methods, viewcache_methods},
    {Py_tp_members, viewcache_members},
    {Py_tp_traverse, viewcache_traverse},
    {Py_tp_clear, viewcache_clear},
    {Py_tp_dealloc, viewcache_dealloc},
    {0, NULL},
};

static PyType_Spec viewcache_spec = {
    "streamrt._viewcache.ViewCache", sizeof(ViewCache), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, viewcache_slots,
};

static PyMethodDef module_methods[] = {
    {"set_fallback", set_fallback, METH_O, "Set the function that answers what array() does not."},
    {NULL, NULL, 0, NULL},
};

static int
module_exec(PyObject *m)
{
    if (readonly_str == NULL && (readonly_str = PyUnicode_InternFromString("readonly")) == NULL)
        return -1;
    PyObject *t = PyType_FromModuleAndSpec(m, &viewcache_spec, NULL);
    if (t == NULL)
        return -1;
    if (PyModule_AddObject(m, "ViewCache", t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot module_slots[] = {{Py_mod_exec, module_exec}, {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "streamrt._viewcache",
    "KernelContext.array's hit path in C (see kernel.PyViews).", 0, module_methods, module_slots,
};

PyMODINIT_FUNC
PyInit__viewcache(void)
{
    return PyModuleDef_Init(&module_def);
}

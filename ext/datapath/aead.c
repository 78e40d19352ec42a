/*
 * Protector: one AEAD key + IV of one direction and key phase.
 *
 * Why a type of its own: OpenSSL key setup is expensive, so each Protector
 * keeps one initialised EVP_CIPHER_CTX per direction and only re-initialises
 * it with the per-packet nonce (as aioquic's _crypto.c does).
 */
#include "datapath.h"

static void wx_nonce(const WxProtector *p, const uint8_t *header, uint8_t *nonce) {
    /* nonce = IV xor (0x0000 || path_id u16 || packet_number u64); both
     * fields are already big-endian in the header (bytes 2..3 and 8..15). */
    memcpy(nonce, p->iv, WX_NONCE_LEN);
    nonce[2] ^= header[2];
    nonce[3] ^= header[3];
    for (int i = 0; i < 8; i++) nonce[4 + i] ^= header[8 + i];
}

int wx_seal(WxProtector *p, const uint8_t *header, const uint8_t *pt1, size_t n1,
            const uint8_t *pt2, size_t n2, uint8_t *out) {
    if (p->kind == WX_CIPHER_NULL) {
        if (n1) memcpy(out, pt1, n1);
        if (n2) memcpy(out + n1, pt2, n2);
        return 0;
    }
    uint8_t nonce[WX_NONCE_LEN];
    int outl = 0;
    uint8_t *w = out;
    wx_nonce(p, header, nonce);
    if (EVP_EncryptInit_ex(p->enc, NULL, NULL, NULL, nonce) != 1) return -1;
    if (EVP_EncryptUpdate(p->enc, NULL, &outl, header, WX_HEADER_LEN) != 1) return -1;
    if (n1) {
        if (EVP_EncryptUpdate(p->enc, w, &outl, pt1, (int)n1) != 1) return -1;
        w += outl;
    }
    if (n2) {
        if (EVP_EncryptUpdate(p->enc, w, &outl, pt2, (int)n2) != 1) return -1;
        w += outl;
    }
    if (EVP_EncryptFinal_ex(p->enc, w, &outl) != 1) return -1;
    w += outl;
    if (w != out + n1 + n2) return -1;
    if (EVP_CIPHER_CTX_ctrl(p->enc, EVP_CTRL_AEAD_GET_TAG, WX_TAG_LEN, w) != 1) return -1;
    return 0;
}

int wx_open(WxProtector *p, const uint8_t *header, const uint8_t *ct, size_t n, uint8_t *out) {
    size_t body = n - p->tag_len;
    if (p->kind == WX_CIPHER_NULL) {
        if (body) memcpy(out, ct, body);
        return 0;
    }
    uint8_t nonce[WX_NONCE_LEN];
    int outl = 0, finl = 0;
    wx_nonce(p, header, nonce);
    if (EVP_DecryptInit_ex(p->dec, NULL, NULL, NULL, nonce) != 1) return -1;
    if (EVP_CIPHER_CTX_ctrl(p->dec, EVP_CTRL_AEAD_SET_TAG, WX_TAG_LEN, (void *)(ct + body)) != 1)
        return -1;
    if (EVP_DecryptUpdate(p->dec, NULL, &outl, header, WX_HEADER_LEN) != 1) return -1;
    outl = 0;
    if (body && EVP_DecryptUpdate(p->dec, out, &outl, ct, (int)body) != 1) return -1;
    if (EVP_DecryptFinal_ex(p->dec, out + outl, &finl) != 1) return -1;
    return 0;
}

static int init_ctx(EVP_CIPHER_CTX **ctx, const EVP_CIPHER *cipher, const uint8_t *key, int enc) {
    *ctx = EVP_CIPHER_CTX_new();
    if (*ctx == NULL) return -1;
    if (EVP_CipherInit_ex(*ctx, cipher, NULL, NULL, NULL, enc) != 1) return -1;
    if (EVP_CIPHER_CTX_ctrl(*ctx, EVP_CTRL_AEAD_SET_IVLEN, WX_NONCE_LEN, NULL) != 1) return -1;
    if (EVP_CipherInit_ex(*ctx, NULL, NULL, key, NULL, enc) != 1) return -1;
    return 0;
}

static int Protector_init(WxProtector *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"cipher", "key", "iv", NULL};
    const char *cipher_name;
    Py_buffer key = {0}, iv = {0};
    int rc = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sy*y*:Protector", kwlist, &cipher_name, &key,
                                     &iv))
        return -1;
    if (self->kind != -1 || self->enc != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Protector is already initialised");
        goto done;
    }
    const EVP_CIPHER *cipher = NULL;
    int kind;
    if (strcmp(cipher_name, "aes-256-gcm") == 0) {
        kind = WX_CIPHER_AES_GCM;
        cipher = EVP_aes_256_gcm();
    } else if (strcmp(cipher_name, "chacha20-poly1305") == 0) {
        kind = WX_CIPHER_CHACHA;
        cipher = EVP_chacha20_poly1305();
    } else if (strcmp(cipher_name, "none") == 0 || strcmp(cipher_name, "null") == 0) {
        kind = WX_CIPHER_NULL;
    } else {
        PyErr_Format(PyExc_ValueError,
                     "cipher: %R is not one of 'aes-256-gcm', 'chacha20-poly1305', 'none'",
                     PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : Py_None);
        goto done;
    }
    if (kind != WX_CIPHER_NULL) {
        if (key.len != WX_KEY_LEN) {
            PyErr_Format(PyExc_ValueError, "key: must be %d bytes, got %zd", WX_KEY_LEN, key.len);
            goto done;
        }
        if (iv.len != WX_NONCE_LEN) {
            PyErr_Format(PyExc_ValueError, "iv: must be %d bytes, got %zd", WX_NONCE_LEN, iv.len);
            goto done;
        }
        memcpy(self->iv, iv.buf, WX_NONCE_LEN);
        if (init_ctx(&self->enc, cipher, key.buf, 1) != 0 ||
            init_ctx(&self->dec, cipher, key.buf, 0) != 0) {
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL failed to initialise the cipher");
            goto done;
        }
        self->tag_len = WX_TAG_LEN;
    } else {
        self->tag_len = 0;
    }
    self->kind = kind; /* only now usable: wx_as_protector() checks kind */
    rc = 0;
done:
    PyBuffer_Release(&key);
    PyBuffer_Release(&iv);
    return rc;
}

static PyObject *Protector_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    WxProtector *self = (WxProtector *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->kind = -1;
    pthread_mutex_init(&self->lock, NULL);
    return (PyObject *)self;
}

static void Protector_dealloc(WxProtector *self) {
    if (self->enc) EVP_CIPHER_CTX_free(self->enc);
    if (self->dec) EVP_CIPHER_CTX_free(self->dec);
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Protector_get_cipher(WxProtector *self, void *closure) {
    switch (self->kind) {
    case WX_CIPHER_AES_GCM: return PyUnicode_FromString("aes-256-gcm");
    case WX_CIPHER_CHACHA: return PyUnicode_FromString("chacha20-poly1305");
    case WX_CIPHER_NULL: return PyUnicode_FromString("none");
    default: Py_RETURN_NONE;
    }
}

static PyObject *Protector_get_tag_len(WxProtector *self, void *closure) {
    return PyLong_FromSize_t(self->tag_len);
}

static PyGetSetDef Protector_getset[] = {
    {"cipher", (getter)Protector_get_cipher, NULL, "AEAD name", NULL},
    {"tag_len", (getter)Protector_get_tag_len, NULL, "bytes of tag appended per datagram", NULL},
    {NULL},
};

PyTypeObject WxProtector_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wanxport._native.Protector",
    .tp_basicsize = sizeof(WxProtector),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Protector(cipher, key, iv): AEAD key of one direction and key phase.",
    .tp_new = Protector_new,
    .tp_init = (initproc)Protector_init,
    .tp_dealloc = (destructor)Protector_dealloc,
    .tp_getset = Protector_getset,
};

WxProtector *wx_as_protector(PyObject *obj, const char *name) {
    if (!PyObject_TypeCheck(obj, &WxProtector_Type)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a Protector, got %.100s", name,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    WxProtector *p = (WxProtector *)obj;
    if (p->kind < 0) {
        PyErr_Format(PyExc_ValueError, "%s: Protector was not initialised", name);
        return NULL;
    }
    return p;
}

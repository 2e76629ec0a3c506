/*
 * rdaq's HDF5 file driver for data files: a POSIX file like HDF5's own sec2 driver, except that
 * a raw-data write of a chunk that the writer lent (crates/sink/src/deferred.rs) is handed to an
 * I/O thread instead of being written under HDF5's lock. HDF5 then only does its bookkeeping
 * serially, and the copy of the chunks into the page cache (nearly all of a data file writer's
 * time) runs on several threads.
 *
 * Ordering: every other write or read of the file waits for the file's handed-on writes first,
 * so metadata never reaches the disk before the chunks it points to (what SWMR readers rely
 * on), and a read sees what was written. Flush, truncate and close wait too, and report the
 * first failed handed-on write.
 *
 * Written in C so that the driver table is laid out by the headers of the HDF5 that is linked
 * (1.10 and 2.x differ).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>
#if H5_VERSION_GE(1, 13, 0)
#include <H5FDdevelop.h>
#endif

/* the Rust side (deferred.rs) */
extern void *rdaq_deferred_open(void);
extern int rdaq_deferred_submit(void *pending, int fd, uint64_t addr, const void *buf, size_t size);
extern int rdaq_deferred_drain(void *pending);
extern int rdaq_deferred_close(void *pending);

typedef struct {
    H5FD_t pub; /* first: HDF5 fills it in */
    int fd;
    haddr_t eoa;
    haddr_t eof;
    dev_t device;
    ino_t inode;
    void *pending;
} rdaq_file_t;

#define MAXADDR (((haddr_t)1 << (8 * sizeof(off_t) - 1)) - 1)
#define OVERFLOW(a, z) (HADDR_UNDEF == (a) || (a) > MAXADDR || (z) > MAXADDR || (a) + (z) > MAXADDR)

static void fail(hid_t major, hid_t minor, const char *what, int err) {
    H5Epush2(H5E_DEFAULT, __FILE__, what, __LINE__, H5E_ERR_CLS, major, minor, "%s: %s", what, strerror(err));
}

static int wait_pending(rdaq_file_t *f, const char *what) {
    int err = rdaq_deferred_drain(f->pending);
    if (err) {
        fail(H5E_VFL, H5E_WRITEERROR, what, err);
        return -1;
    }
    return 0;
}

static H5FD_t *rd_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
    (void)fapl;
    if (!name || !*name || maxaddr == 0 || maxaddr == HADDR_UNDEF || maxaddr > MAXADDR) {
        H5Epush2(H5E_DEFAULT, __FILE__, "open", __LINE__, H5E_ERR_CLS, H5E_ARGS, H5E_BADVALUE, "bad file name or size");
        return NULL;
    }
    int o = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
    if (flags & H5F_ACC_TRUNC) o |= O_TRUNC;
    if (flags & H5F_ACC_CREAT) o |= O_CREAT;
    if (flags & H5F_ACC_EXCL) o |= O_EXCL;
    int fd = open(name, o | O_CLOEXEC, 0666);
    if (fd < 0) {
        fail(H5E_FILE, H5E_CANTOPENFILE, name, errno);
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fail(H5E_FILE, H5E_BADFILE, name, errno);
        close(fd);
        return NULL;
    }
    rdaq_file_t *f = calloc(1, sizeof(*f));
    if (!f) {
        close(fd);
        return NULL;
    }
    f->fd = fd;
    f->eof = (haddr_t)st.st_size;
    f->device = st.st_dev;
    f->inode = st.st_ino;
    f->pending = rdaq_deferred_open();
    return &f->pub;
}

static herr_t rd_close(H5FD_t *file) {
    rdaq_file_t *f = (rdaq_file_t *)file;
    int err = rdaq_deferred_close(f->pending);
    int closed = close(f->fd);
    int close_err = errno;
    free(f);
    if (err) {
        fail(H5E_VFL, H5E_WRITEERROR, "close", err);
        return -1;
    }
    if (closed != 0) {
        fail(H5E_IO, H5E_CANTCLOSEFILE, "close", close_err);
        return -1;
    }
    return 0;
}

static int rd_cmp(const H5FD_t *a, const H5FD_t *b) {
    const rdaq_file_t *x = (const rdaq_file_t *)a, *y = (const rdaq_file_t *)b;
    if (x->device != y->device) return x->device < y->device ? -1 : 1;
    if (x->inode != y->inode) return x->inode < y->inode ? -1 : 1;
    return 0;
}

static herr_t rd_query(const H5FD_t *file, unsigned long *flags) {
    (void)file;
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
             H5FD_FEAT_AGGREGATE_SMALLDATA | H5FD_FEAT_POSIX_COMPAT_HANDLE | H5FD_FEAT_SUPPORTS_SWMR_IO |
             H5FD_FEAT_DEFAULT_VFD_COMPATIBLE;
    return 0;
}

static haddr_t rd_get_eoa(const H5FD_t *file, H5FD_mem_t type) {
    (void)type;
    return ((const rdaq_file_t *)file)->eoa;
}

static herr_t rd_set_eoa(H5FD_t *file, H5FD_mem_t type, haddr_t addr) {
    (void)type;
    ((rdaq_file_t *)file)->eoa = addr;
    return 0;
}

static haddr_t rd_get_eof(const H5FD_t *file, H5FD_mem_t type) {
    (void)type;
    return ((const rdaq_file_t *)file)->eof;
}

static herr_t rd_get_handle(H5FD_t *file, hid_t fapl, void **handle) {
    (void)fapl;
    *handle = &((rdaq_file_t *)file)->fd;
    return 0;
}

static herr_t rd_read(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, void *buf) {
    (void)type;
    (void)dxpl;
    rdaq_file_t *f = (rdaq_file_t *)file;
    if (OVERFLOW(addr, (haddr_t)size)) {
        H5Epush2(H5E_DEFAULT, __FILE__, "read", __LINE__, H5E_ERR_CLS, H5E_ARGS, H5E_OVERFLOW, "address overflow");
        return -1;
    }
    if (wait_pending(f, "read") < 0) return -1;
    unsigned char *p = buf;
    while (size > 0) {
        ssize_t n = pread(f->fd, p, size, (off_t)addr);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            fail(H5E_IO, H5E_READERROR, "read", errno);
            return -1;
        }
        if (n == 0) { /* past the end of the file: zeros, as HDF5 expects */
            memset(p, 0, size);
            break;
        }
        p += n;
        addr += (haddr_t)n;
        size -= (size_t)n;
    }
    return 0;
}

static herr_t rd_write(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, const void *buf) {
    (void)dxpl;
    rdaq_file_t *f = (rdaq_file_t *)file;
    if (OVERFLOW(addr, (haddr_t)size)) {
        H5Epush2(H5E_DEFAULT, __FILE__, "write", __LINE__, H5E_ERR_CLS, H5E_ARGS, H5E_OVERFLOW, "address overflow");
        return -1;
    }
    if (type == H5FD_MEM_DRAW) {
        int taken = rdaq_deferred_submit(f->pending, f->fd, (uint64_t)addr, buf, size);
        if (taken < 0) {
            /* an earlier handed-on write of this file failed */
            return wait_pending(f, "write");
        }
        if (taken) {
            if (addr + size > f->eof) f->eof = addr + size;
            return 0;
        }
    }
    if (wait_pending(f, "write") < 0) return -1;
    const unsigned char *p = buf;
    haddr_t at = addr;
    size_t left = size;
    while (left > 0) {
        ssize_t n = pwrite(f->fd, p, left, (off_t)at);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            fail(H5E_IO, H5E_WRITEERROR, "write", errno);
            return -1;
        }
        p += n;
        at += (haddr_t)n;
        left -= (size_t)n;
    }
    if (addr + size > f->eof) f->eof = addr + size;
    return 0;
}

#if H5_VERSION_GE(1, 13, 0)
typedef bool rd_bool;
#else
typedef hbool_t rd_bool;
#endif

static herr_t rd_flush(H5FD_t *file, hid_t dxpl, rd_bool closing) {
    (void)dxpl;
    (void)closing;
    return wait_pending((rdaq_file_t *)file, "flush");
}

static herr_t rd_truncate(H5FD_t *file, hid_t dxpl, rd_bool closing) {
    (void)dxpl;
    (void)closing;
    rdaq_file_t *f = (rdaq_file_t *)file;
    if (wait_pending(f, "truncate") < 0) return -1;
    if (f->eoa != f->eof) {
        if (ftruncate(f->fd, (off_t)f->eoa) != 0) {
            fail(H5E_IO, H5E_SEEKERROR, "truncate", errno);
            return -1;
        }
        f->eof = f->eoa;
    }
    return 0;
}

static herr_t rd_lock(H5FD_t *file, rd_bool rw) {
    rdaq_file_t *f = (rdaq_file_t *)file;
    if (flock(f->fd, (rw ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
        if (errno == ENOSYS) return 0; /* a file system without locks, as sec2 treats it */
        fail(H5E_VFL, H5E_CANTLOCKFILE, "lock", errno);
        return -1;
    }
    return 0;
}

static herr_t rd_unlock(H5FD_t *file) {
    rdaq_file_t *f = (rdaq_file_t *)file;
    if (flock(f->fd, LOCK_UN) != 0 && errno != ENOSYS) {
        fail(H5E_VFL, H5E_CANTUNLOCKFILE, "unlock", errno);
        return -1;
    }
    return 0;
}

static H5FD_class_t rdaq_class;
static hid_t rdaq_driver = H5I_INVALID_HID;

/* The driver's id, registered on first use. Called under the Rust bindings' HDF5 lock. */
hid_t rdaq_deferred_driver(void) {
    if (rdaq_driver >= 0) return rdaq_driver;
    memset(&rdaq_class, 0, sizeof(rdaq_class));
#if H5_VERSION_GE(1, 13, 0)
    rdaq_class.version = H5FD_CLASS_VERSION;
    rdaq_class.value = 416; /* in the range HDF5 leaves to drivers of its users */
#endif
    rdaq_class.name = "rdaq_deferred";
    rdaq_class.maxaddr = MAXADDR;
    rdaq_class.fc_degree = H5F_CLOSE_WEAK;
    rdaq_class.open = rd_open;
    rdaq_class.close = rd_close;
    rdaq_class.cmp = rd_cmp;
    rdaq_class.query = rd_query;
    rdaq_class.get_eoa = rd_get_eoa;
    rdaq_class.set_eoa = rd_set_eoa;
    rdaq_class.get_eof = rd_get_eof;
    rdaq_class.get_handle = rd_get_handle;
    rdaq_class.read = rd_read;
    rdaq_class.write = rd_write;
    rdaq_class.flush = rd_flush;
    rdaq_class.truncate = rd_truncate;
    rdaq_class.lock = rd_lock;
    rdaq_class.unlock = rd_unlock;
    const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY; /* sec2's free-list map */
    memcpy(rdaq_class.fl_map, map, sizeof(map));
    rdaq_driver = H5FDregister(&rdaq_class);
    return rdaq_driver;
}

/*
** Inside the checkpoint module: what its directories (checkpoint_dir.c)
** read of a file (checkpoint.c).
*/
#ifndef REPIPE_CHECKPOINT_IMPL_H
#define REPIPE_CHECKPOINT_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#define RPI_CKPT_PREFIX "ckpt-"
#define RPI_CKPT_SUFFIX ".rpc"

/* The run (empty for a file that names none) and the update of a
** checkpoint's header, read alone, its own checksum checked; false when
** the file is not a regular file or its header cannot be read. */
bool rpi_checkpoint_peek(const char *path, char *run, size_t cap, long long *update);

#endif /* REPIPE_CHECKPOINT_IMPL_H */

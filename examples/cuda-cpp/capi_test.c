/* The C API on bad input, in C: every call answers with an error code and a message, never a
 * crash. On a machine with a GPU it also makes real heaps and misuses them (destroyed handles,
 * growing a fixed heap, sizes past every limit). Without a driver it checks what can be checked
 * and says so. Prints one line per check; exits with 1 if any failed.
 * Build: cc capi_test.c -Iinclude -Lbundle-cpp/lib -ltoga (docs/cpp.md). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "toga.h"

static int checks, failures;

static void expect(const char *what, toga_status got, toga_status want) {
  checks++;
  const char *msg = toga_last_error_message();
  if (got != want) {
    failures++;
    printf("FAIL %s: %s (%d), expected %s (%d): %s\n", what, toga_status_string(got), (int)got,
           toga_status_string(want), (int)want, msg);
    return;
  }
  /* Every failure explains itself; a success leaves no message. */
  if ((want != TOGA_SUCCESS) != (msg[0] != '\0')) {
    failures++;
    printf("FAIL %s: message \"%s\"\n", what, msg);
    return;
  }
  printf("ok   %s: %s%s%s\n", what, toga_status_string(got), msg[0] ? ": " : "", msg);
}

static void without_a_device(void) {
  toga_heap h = {0}, none = {0}, unknown = {123456789};
  void *base = NULL;
  toga_stats st;
  expect("device count into NULL", toga_device_count(NULL), TOGA_ERROR_INVALID_VALUE);
  expect("create into NULL", toga_heap_create(0, 1u << 30, NULL, NULL), TOGA_ERROR_INVALID_VALUE);
  expect("create of 0 bytes", toga_heap_create(0, 0, NULL, &h), TOGA_ERROR_INVALID_SIZE);
  expect("create of 4 KiB", toga_heap_create(0, 4096, NULL, &h), TOGA_ERROR_INVALID_SIZE);
  expect("create of 2^64-1 bytes", toga_heap_create(0, UINT64_MAX, NULL, &h), TOGA_ERROR_TOO_LARGE);
  expect("create on device -1", toga_heap_create(-1, 1u << 30, NULL, &h),
         TOGA_ERROR_INVALID_DEVICE);
  toga_growable_options bad_flags = {0};
  bad_flags.flags = 0x100;
  expect("growable with unknown flags", toga_heap_create_growable(0, &bad_flags, NULL, &h),
         TOGA_ERROR_INVALID_VALUE);
  toga_growable_options upside_down = {0};
  upside_down.initial_bytes = 1ull << 30;
  upside_down.max_bytes = 1ull << 21;
  expect("growable with initial > max", toga_heap_create_growable(0, &upside_down, NULL, &h),
         TOGA_ERROR_TOO_LARGE);
  expect("base of handle 0", toga_heap_base(none, &base), TOGA_ERROR_INVALID_HANDLE);
  expect("base of an unknown handle", toga_heap_base(unknown, &base), TOGA_ERROR_INVALID_HANDLE);
  expect("stats of handle 0", toga_heap_stats(none, NULL, &st), TOGA_ERROR_INVALID_HANDLE);
  expect("trim of handle 0", toga_heap_trim(none, NULL), TOGA_ERROR_INVALID_HANDLE);
  expect("grow of handle 0", toga_heap_grow(none, NULL, 1 << 21, NULL), TOGA_ERROR_INVALID_HANDLE);
  expect("destroy of handle 0", toga_heap_destroy(none, NULL), TOGA_ERROR_INVALID_HANDLE);
  expect("destroy of an unknown handle", toga_heap_destroy(unknown, NULL),
         TOGA_ERROR_INVALID_HANDLE);
  checks++;
  if (h.id != 0 || base != NULL) {
    failures++;
    printf("FAIL a failed call wrote its output\n");
  }
  checks++;
  if (strcmp(toga_status_string(999), "unknown status code") != 0) {
    failures++;
    printf("FAIL toga_status_string(999)\n");
  }
}

static void with_a_device(int count) {
  toga_heap fixed, grow;
  toga_stats st;
  void *base = NULL;
  uint64_t n = 0;
  expect("create on device `count`", toga_heap_create(count, 1u << 30, NULL, &fixed),
         TOGA_ERROR_INVALID_DEVICE);
  expect("create of 1 PiB", toga_heap_create(0, 1ull << 50, NULL, &fixed), TOGA_ERROR_TOO_LARGE);
  expect("create a 64 MiB heap", toga_heap_create(0, 64u << 20, NULL, &fixed), TOGA_SUCCESS);
  expect("its base", toga_heap_base(fixed, &base), TOGA_SUCCESS);
  expect("its stats", toga_heap_stats(fixed, NULL, &st), TOGA_SUCCESS);
  checks++;
  if (base == NULL || st.capacity_bytes != 64u << 20 || st.live_blocks != 0 || st.growable) {
    failures++;
    printf("FAIL fixed heap: base %p, capacity %llu, live %llu, growable %u\n", base,
           (unsigned long long)st.capacity_bytes, (unsigned long long)st.live_blocks, st.growable);
  }
  expect("stats into NULL", toga_heap_stats(fixed, NULL, NULL), TOGA_ERROR_INVALID_VALUE);
  expect("grow a fixed heap", toga_heap_grow(fixed, NULL, 1 << 21, &n), TOGA_ERROR_NOT_GROWABLE);
  expect("trim", toga_heap_trim(fixed, NULL), TOGA_SUCCESS);
  expect("trim_to a fixed heap", toga_heap_trim_to(fixed, NULL, 0, &n), TOGA_SUCCESS);
  expect("synchronize", toga_heap_synchronize(fixed, NULL), TOGA_SUCCESS);
  expect("reset", toga_heap_reset(fixed, NULL), TOGA_SUCCESS);
  expect("destroy", toga_heap_destroy(fixed, NULL), TOGA_SUCCESS);
  expect("destroy again", toga_heap_destroy(fixed, NULL), TOGA_ERROR_INVALID_HANDLE);
  expect("stats after destroy", toga_heap_stats(fixed, NULL, &st), TOGA_ERROR_INVALID_HANDLE);
  expect("base after destroy", toga_heap_base(fixed, &base), TOGA_ERROR_INVALID_HANDLE);
  expect("synchronize after destroy", toga_heap_synchronize(fixed, NULL),
         TOGA_ERROR_INVALID_HANDLE);

  toga_growable_options o = {0};
  o.max_bytes = 256u << 20;
  expect("create a growable heap", toga_heap_create_growable(0, &o, NULL, &grow), TOGA_SUCCESS);
  expect("grow by 0", toga_heap_grow(grow, NULL, 0, &n), TOGA_ERROR_INVALID_SIZE);
  expect("grow past the maximum", toga_heap_grow(grow, NULL, 1ull << 30, &n), TOGA_ERROR_TOO_LARGE);
  expect("grow by 32 MiB", toga_heap_grow(grow, NULL, 32u << 20, &n), TOGA_SUCCESS);
  expect("its stats", toga_heap_stats(grow, NULL, &st), TOGA_SUCCESS);
  checks++;
  if (!st.growable || st.mapped_bytes != n || n < (32u << 20) || st.max_bytes > o.max_bytes) {
    failures++;
    printf("FAIL growable heap: mapped %llu (grow said %llu), max %llu\n",
           (unsigned long long)st.mapped_bytes, (unsigned long long)n,
           (unsigned long long)st.max_bytes);
  }
  uint64_t released = 0;
  expect("trim_to 0", toga_heap_trim_to(grow, NULL, 0, &released), TOGA_SUCCESS);
  checks++;
  if (released == 0) {
    failures++;
    printf("FAIL trim_to released nothing of an empty heap\n");
  }
  expect("destroy it", toga_heap_destroy(grow, NULL), TOGA_SUCCESS);
  expect("grow after destroy", toga_heap_grow(grow, NULL, 1 << 21, &n), TOGA_ERROR_INVALID_HANDLE);
}

int main(int argc, char **argv) {
  int count = 0;
  int need_gpu = argc > 1 && strcmp(argv[1], "--gpu") == 0;
  without_a_device();
  toga_status s = toga_device_count(&count);
  if (s == TOGA_SUCCESS && count > 0) {
    with_a_device(count);
  } else {
    /* No driver or no device: the same calls must say so instead of crashing. */
    toga_heap h = {0};
    toga_status c = toga_heap_create(0, 1u << 30, NULL, &h);
    checks++;
    if (c != s && !(s == TOGA_SUCCESS && c == TOGA_ERROR_NO_DEVICE)) {
      failures++;
      printf("FAIL create without a device: %s, device count said %s\n", toga_status_string(c),
             toga_status_string(s));
    }
    printf("no GPU (%s: %s): the checks that need one did not run\n", toga_status_string(s),
           toga_last_error_message());
    if (need_gpu) failures++;
  }
  printf("capi_test: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}

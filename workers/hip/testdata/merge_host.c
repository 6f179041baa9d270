// Host harness for zaya_attention.h: prints zaya_merge_lse and zaya_merge_weight for each
// pair of LSE values on the command line ("-inf" allowed), so a Go test can hold the kernels'
// math to the Go backend's.
#include <stdio.h>
#include <stdlib.h>
#include "../zaya_attention.h"

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    float a = strtof(argv[i], NULL), b = strtof(argv[i + 1], NULL);
    printf("%.9g %.9g\n", zaya_merge_lse(a, b), zaya_merge_weight(a, b));
  }
  return 0;
}

#!/usr/bin/perl -0p
# emulate_source.pl: rewrites the two pieces of CUDA syntax that a C++ compiler cannot read into calls of
# emulate.h, so a kernel file and the llmc headers it includes build with g++ (`make emulate`):
#   kernel<<<grid, block, smem, stream>>>(args)    ->  emu::Launch(grid, block, smem, stream).run(kernel, args)
#   extern __shared__ [__align__(n)] T name[];     ->  T* name = (T*)emu::dynamic_shared();
# Everything else is left as written.
s/([\w:]+(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(/emu::Launch($2).run($1, /gs;
s/extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w:][\w:\s]*?)\s+(\w+)\s*\[\s*\]\s*;/$1* $2 = ($1*)emu::dynamic_shared();/g;

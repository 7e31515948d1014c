#!/usr/bin/perl -0p
# emulate_source.pl: rewrites the CUDA syntax that a C++ compiler cannot read into calls of emulate.h, so a
# kernel file and the llmc headers it includes build with g++ (`make emulate`):
#   kernel<<<grid, block, smem, stream>>>(args)    ->  emu::Launch(grid, block, smem, stream).run(kernel, args)
#   extern __shared__ [__align__(n)] T name[];     ->  T* name = (T*)emu::dynamic_shared();
#   __shared__ [__align__(n)] T a[N][M], b;        ->  static emu::Shared<T[N][M]> a_shared; auto& a = a_shared.fresh();
#                                                      (the same for b), refilled with NaN for each block
# Everything else is left as written.
sub static_shared {
    my ($type, $declarators) = @_;
    my $out = "";
    for my $d (split /\s*,\s*/, $declarators) {
        $d =~ /^(\w+)((?:\s*\[[^\]]*\])*)$/ or die "emulate_source.pl: cannot read the __shared__ declarator '$d'\n";
        $out .= "static emu::Shared<$type$2> $1_shared; auto& $1 = $1_shared.fresh(); ";
    }
    return $out;
}
s/([\w:]+(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(/emu::Launch($2).run($1, /gs;
s/extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w:][\w:\s]*?)\s+(\w+)\s*\[\s*\]\s*;/$1* $2 = ($1*)emu::dynamic_shared();/g;
s/__shared__\s+(?:__align__\(\d+\)\s+)?([\w:]+)\s+([^;]+?)\s*;/static_shared($1, $2)/ge;

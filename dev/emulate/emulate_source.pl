#!/usr/bin/perl -0p
# emulate_source.pl: rewrites the CUDA syntax that a C++ compiler cannot read into calls of emulate.h, so a
# CUDA source (a dev/cuda kernel file, train_gpt.cu, test_gpt.cu) and the llmc headers it includes build
# with g++ (README.md in this folder):
#   kernel<<<grid, block, smem, stream>>>(args)    ->  emu::Launch("kernel", grid, block, smem, stream).run(kernel, args)
#   extern __shared__ [__align__(n)] T name[];     ->  T* name = (T*)emu::dynamic_shared();
#   __shared__ [__align__(n)] T a[N][M], b;        ->  static emu::Shared<T[N][M], n> a_shared; auto& a = a_shared.fresh();
#                                                      (the same for b), refilled with NaN for each block
#   __launch_bounds__(N) kernel(params) {          ->  kernel(params) { if (emu::above_launch_bounds("kernel", N)) return;
#                                                      (a block of more than N threads is refused, as on the GPU)
# Everything else is left as written. A declaration must sit on one line; a comment that reads like one
# on one line is rewritten too (harmless, it stays a comment); one at file scope would not be refilled.
# A __shared__ or __launch_bounds__ left over (e.g. a bound on a declaration without its body) fails to compile
# (emulate.h defines them so).
sub static_shared {
    my ($align, $type, $declarators) = @_;
    my $out = "";
    for my $d (split /\s*,\s*/, $declarators) {
        $d =~ /^(\w+)((?:\s*\[[^\]]*\])*)\s*$/;
        $out .= "static emu::Shared<$type$2, " . ($align || 16) . "> $1_shared; auto& $1 = $1_shared.fresh(); ";
    }
    return $out;
}
s/(([\w:]+)(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(/emu::Launch("$2", $3).run($1, /gs;
s/__launch_bounds__\s*\(((?:[^()]|\([^()]*\))*)\)\s*(\w+)(\s*\([^()]*\)\s*)\{/$2$3\{ if (emu::above_launch_bounds("$2", $1)) return;/g;
s/extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w:][\w:\s]*?)\s+(\w+)\s*\[\s*\]\s*;/$1* $2 = ($1*)emu::dynamic_shared();/g;
s/__shared__[ \t]+(?:__align__\((\d+)\)[ \t]+)?([\w:][\w: \t]*?)[ \t]+(\w+[ \t]*(?:\[[^\];\n]*\][ \t]*)*(?:,[ \t]*\w+[ \t]*(?:\[[^\];\n]*\][ \t]*)*)*);/static_shared($1, $2, $3)/ge;

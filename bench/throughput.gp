# Events/s per mode from a bench report, as drawn by scripts/bench.sh:
#   idemkafka-bench --plot-data latest.json > throughput.dat
#   gnuplot -e "datafile='throughput.dat'; outfile='throughput.png'" bench/throughput.gp
# Each bar is a mode at the largest count it ran (named in the label: the
# per-record modes run fewer records); one bar per duplicate share.
if (!exists("datafile")) datafile = 'bench/results/throughput.dat'
if (!exists("outfile")) outfile = 'bench/results/throughput.png'

set terminal pngcairo size 1200,650 font ",10" noenhanced
set output outfile
set title "idemkafka-bench: events/s per mode (log scale; same data, PostgreSQL and broker)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set logscale y
set yrange [100:*]
set format y "%.0s%c"
set ylabel "events/s"
set grid ytics
set xtics rotate by 25 right
set key top right
set bmargin 9

plot for [col=2:*] datafile using col:xtic(1) title columnhead(col) noenhanced

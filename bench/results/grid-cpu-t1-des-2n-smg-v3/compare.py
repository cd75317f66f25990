import json, glob, os, statistics as st, sys
v4 = json.load(open('../grid-cpu-t1-des-2n-v4/grid.json'))['rows']
old = {}
for r in v4:
    old.setdefault((r['cell'], r['router']), []).append(r['steps_per_min'])
new = {}
for s in (1, 2):
    for d in glob.glob(f'/work/scratch/final/grid-2n-smg-v3-s{s}/*-r1'):
        cell = os.path.basename(d)[:-3]
        if not os.path.exists(d + '/results.json'):
            continue
        for r in json.load(open(d + '/results.json'))['results']:
            new.setdefault(cell, []).append(r['steps_per_min'])
cells = sorted({c for c, _ in old})
rat_old, rat_new, rows = [], [], []
for c in cells:
    th = st.mean(old[(c, 'thunder')]); di = st.mean(old[(c, 'direct')]); so = st.mean(old[(c, 'smg-cache_aware')])
    if c not in new or len(new[c]) < 2:
        continue
    sn = st.mean(new[c])
    ro, rn = th / max(di, so), th / max(di, sn)
    rat_old.append(ro); rat_new.append(rn)
    rows.append((c, th, di, so, sn, ro, rn))
print(f"cells {len(rows)}; thunder / best: old worst {min(rat_old):.3f} below0.97 {sum(r<0.97 for r in rat_old)} geo {st.geometric_mean(rat_old):.3f}; "
      f"new worst {min(rat_new):.3f} below0.97 {sum(r<0.97 for r in rat_new)} geo {st.geometric_mean(rat_new):.3f}")
print(f"smg new/old: geo {st.geometric_mean([r[4]/r[3] for r in rows]):.3f} min {min(r[4]/r[3] for r in rows):.3f} max {max(r[4]/r[3] for r in rows):.3f}")
print("cells where smg beats direct now:", sum(r[4] > r[2] for r in rows), "before:", sum(r[3] > r[2] for r in rows))
if len(sys.argv) > 1:
    with open(sys.argv[1], 'w') as f:
        f.write("| cell | thunder | direct | smg cache_aware before | smg cache_aware now | thunder ÷ best before | now |\n|---|---:|---:|---:|---:|---:|---:|\n")
        for c, th, di, so, sn, ro, rn in rows:
            f.write(f"| {c} | {th:.1f} | {di:.1f} | {so:.1f} | {sn:.1f} | {ro:.3f} | {rn:.3f} |\n")

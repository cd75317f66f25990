import sys
from thunder_sgl.benchmark.des.run import run_des
cl=sys.argv[1]; N=int(sys.argv[2]); seeds=range(1,int(sys.argv[3])+1); router=sys.argv[4] if len(sys.argv)>4 else 'thunder'
tot=[]
for s in seeds:
    r=run_des(cl,1,router,'cpu-agent',N,180,120,s,warm_start=True)
    tot.append(r.steps_per_min)
    print(s, round(r.steps_per_min,1), round(r.kv_hit_rate,3), r.notes.split('admission=')[-1] if 'admission=' in r.notes else '', flush=True)
print('mean', round(sum(tot)/len(tot),1))

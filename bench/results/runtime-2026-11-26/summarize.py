import json,re,glob,statistics,sys,os
W='/tmp/rtb-session/raw'
runs={}
for f in sorted(glob.glob(W+'/run*-*.txt')):
    m=re.search(r'run(\d+)-(\w+)\.txt',f); i,side=int(m.group(1)),m.group(2)
    rows={}; load=None; paired=None
    for line in open(f):
        if line.startswith('# 20'):
            load=line.split('load average:')[1].strip()
        if line.startswith('# paired'):
            paired=line.strip()
        if line.startswith('#') or not line.strip(): continue
        parts=re.split(r'\s{2,}',line.strip())
        if len(parts)==9: parts=parts[:8]+parts[8].split(' ',1)
        if len(parts)<10: continue
        name=re.sub(r' \(/tmp[^)]*\)','',parts[0])
        key=name+' / '+parts[2]
        rows[key]=dict(groups=int(parts[1]),backward=parts[2],median_us=int(parts[3]),mean_us=int(parts[4]),min_us=int(parts[5]),predicted_us=int(parts[6]),vs_baseline=float(parts[8]),check=parts[9])
    runs.setdefault(side,[]).append(dict(run=i,load=load,paired=paired,rows=rows))
summary={}
for side,rs in runs.items():
    keys=rs[0]['rows'].keys()
    summary[side]={k:dict(median_us=[r['rows'][k]['median_us'] for r in rs],min_us=[r['rows'][k]['min_us'] for r in rs],vs_baseline=[r['rows'][k]['vs_baseline'] for r in rs],check=sorted(set(r['rows'][k]['check'] for r in rs))) for k in keys}
json.dump(dict(runs=runs,summary=summary),open('/tmp/rtb-session/results.json','w'),indent=1)
for k in summary.get('main',{}):
    a=summary['main'][k]; b=summary.get('branch',{}).get(k)
    if not b: continue
    fmt=lambda v:'%d' % statistics.median(v)+' ['+'%d'%min(v)+'-'+'%d'%max(v)+']'
    print('%-50s main %-26s branch %-26s main/branch vs_baseline %s / %s  %s'%(k,fmt(a['median_us']),fmt(b['median_us']),[round(x,3) for x in a['vs_baseline']],[round(x,3) for x in b['vs_baseline']],b['check']))
